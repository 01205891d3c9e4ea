// Package fragmentation is GpuFragmentation, a kube-scheduler score plugin that places each pod
// where it uses up the least of the room the cluster still has for the GPU pod shapes that
// arrive, in the spirit of FGD (Weng et al., "Beware of Fragmentation: Scheduling GPU-Sharing
// Workloads with Fragmentation Gradient Descent", USENIX ATC'23), adapted to whole GPUs and
// to the cpu and memory those pods need beside them.
//
// The workload model is learned from the pods the plugin scores (the GPU pods' shapes, by
// count) and from the pods already bound when it starts; before a shape has been seen, one
// prior class per node shape (a pod taking the whole node) keeps a node only such a pod fits
// from being broken up first. See model.go for the cost and bench/README.md for the numbers.
//
// The plugin needs the whole cluster's free room in every cycle, so it does not sign pods for
// opportunistic batching (KEP-5598): a pod's best node depends on more than the pod.
package fragmentation

import (
	"context"
	"fmt"
	"math"
	"sync"

	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	resourcehelper "k8s.io/component-helpers/resource"
	"k8s.io/klog/v2"
	fwk "k8s.io/kube-scheduler/framework"
	frameworkruntime "k8s.io/kubernetes/pkg/scheduler/framework/runtime"
)

// Name is the plugin's name in a KubeSchedulerConfiguration.
const Name = "GpuFragmentation"

const stateKey fwk.StateKey = Name

// costScale turns a cost into the int64 a Score plugin returns, keeping 12 decimals.
const costScale = 1e12

// Args are the plugin's arguments (pluginConfig[].args); every field is optional.
type Args struct {
	// GPUResources are the extended resources counted as GPUs, summed (default nvidia.com/gpu).
	GPUResources []string `json:"gpuResources,omitempty"`
	// MaxClasses is how many of the most frequent learned pod shapes the model keeps (default 64).
	MaxClasses *int `json:"maxClasses,omitempty"`
	// PriorWeight is the weight of each whole-node prior class (default 0.003; 0 turns them off).
	PriorWeight *float64 `json:"priorWeight,omitempty"`
	// Window is the number of GPU pods after which the learned counts are halved (default 10000).
	Window *int `json:"window,omitempty"`
}

// Defaults of Args.
const (
	DefaultGPUResource = "nvidia.com/gpu"
	DefaultMaxClasses  = 64
	DefaultPriorWeight = 0.003
	DefaultWindow      = 10000
)

type config struct {
	gpuResources []v1.ResourceName
	maxClasses   int
	priorWeight  float64
	window       int
}

// ParseArgs applies the defaults and checks the values; an error names the field, the value
// and what is allowed.
func ParseArgs(args Args) (config, error) {
	c := config{maxClasses: DefaultMaxClasses, priorWeight: DefaultPriorWeight, window: DefaultWindow}
	names := args.GPUResources
	if len(names) == 0 {
		names = []string{DefaultGPUResource}
	}
	for _, n := range names {
		if n == "" || n == string(v1.ResourceCPU) || n == string(v1.ResourceMemory) {
			return c, fmt.Errorf("%s args: gpuResources contains %q; expected extended resource names such as %s", Name, n, DefaultGPUResource)
		}
		c.gpuResources = append(c.gpuResources, v1.ResourceName(n))
	}
	if args.MaxClasses != nil {
		if *args.MaxClasses < 1 || *args.MaxClasses > 1024 {
			return c, fmt.Errorf("%s args: maxClasses is %d; expected 1 to 1024", Name, *args.MaxClasses)
		}
		c.maxClasses = *args.MaxClasses
	}
	if args.PriorWeight != nil {
		w := *args.PriorWeight
		if math.IsNaN(w) || w < 0 || w > 1 {
			return c, fmt.Errorf("%s args: priorWeight is %v; expected 0 (no priors) to 1", Name, w)
		}
		c.priorWeight = w
	}
	if args.Window != nil {
		if *args.Window < 2 {
			return c, fmt.Errorf("%s args: window is %d; expected at least 2 pods", Name, *args.Window)
		}
		c.window = *args.Window
	}
	return c, nil
}

// Plugin is the GpuFragmentation score plugin.
type Plugin struct {
	handle fwk.Handle
	config config

	mu      sync.Mutex
	learner *Learner
	seen    map[types.UID]struct{}
	seeded  bool
}

var (
	_ fwk.PreScorePlugin  = &Plugin{}
	_ fwk.ScorePlugin     = &Plugin{}
	_ fwk.ScoreExtensions = &Plugin{}
)

// New is the plugin factory registered with the scheduler command.
func New(_ context.Context, obj runtime.Object, handle fwk.Handle) (fwk.Plugin, error) {
	var args Args
	if obj != nil {
		if err := frameworkruntime.DecodeInto(obj, &args); err != nil {
			return nil, fmt.Errorf("%s args: %w", Name, err)
		}
	}
	c, err := ParseArgs(args)
	if err != nil {
		return nil, err
	}
	return &Plugin{handle: handle, config: c, learner: NewLearner(c.window), seen: map[types.UID]struct{}{}}, nil
}

// Name of the plugin.
func (p *Plugin) Name() string { return Name }

type cycleState struct {
	model *Model
	pod   Amounts
}

func (s *cycleState) Clone() fwk.StateData { return s }

// PodAmounts is what the pod requests: GPUs summed over the GPU resources, cpu and memory.
func (p *Plugin) PodAmounts(pod *v1.Pod) Amounts {
	req := resourcehelper.PodRequests(pod, resourcehelper.PodResourcesOptions{})
	a := Amounts{MilliCPU: req.Cpu().MilliValue(), Memory: req.Memory().Value()}
	for _, name := range p.config.gpuResources {
		if q, ok := req[name]; ok {
			a.GPUs += q.Value()
		}
	}
	return a
}

// Free is what a node has left: allocatable minus what its pods (bound and assumed) request.
func (p *Plugin) Free(node fwk.NodeInfo) Amounts {
	return p.capacity(node).Sub(p.requested(node))
}

func (p *Plugin) capacity(node fwk.NodeInfo) Amounts {
	alloc := node.GetAllocatable()
	return Amounts{GPUs: p.gpus(alloc), MilliCPU: alloc.GetMilliCPU(), Memory: alloc.GetMemory()}
}

func (p *Plugin) requested(node fwk.NodeInfo) Amounts {
	req := node.GetRequested()
	return Amounts{GPUs: p.gpus(req), MilliCPU: req.GetMilliCPU(), Memory: req.GetMemory()}
}

func (p *Plugin) gpus(r fwk.Resource) int64 {
	var n int64
	scalars := r.GetScalarResources()
	for _, name := range p.config.gpuResources {
		n += scalars[name]
	}
	return n
}

// PreScore learns the pod's shape and computes the model over every node of the snapshot
// (the supply counts nodes the pod does not fit too).
func (p *Plugin) PreScore(ctx context.Context, state fwk.CycleState, pod *v1.Pod, _ []fwk.NodeInfo) *fwk.Status {
	nodes, err := p.handle.SnapshotSharedLister().NodeInfos().List()
	if err != nil {
		return fwk.AsStatus(fmt.Errorf("listing nodes: %w", err))
	}
	podAmounts := p.PodAmounts(pod)
	free := make([]Amounts, 0, len(nodes))
	gpus := make([]int64, 0, len(nodes))
	priors := make([]Amounts, 0, len(nodes))
	for _, n := range nodes {
		if n.Node() == nil { // pods of a node being removed: no room
			continue
		}
		capacity := p.capacity(n)
		free = append(free, capacity.Sub(p.requested(n)))
		gpus = append(gpus, capacity.GPUs)
		priors = append(priors, capacity)
	}

	p.mu.Lock()
	if !p.seeded {
		p.seeded = true
		for _, n := range nodes {
			for _, pi := range n.GetPods() {
				p.observe(pi.GetPod())
			}
		}
	}
	p.observe(pod)
	classes := p.learner.Classes(p.config.maxClasses, priors, p.config.priorWeight)
	p.mu.Unlock()

	if len(classes) == 0 {
		return fwk.NewStatus(fwk.Skip)
	}
	state.Write(stateKey, &cycleState{model: NewModel(classes, free, gpus), pod: podAmounts})
	if logger := klog.FromContext(ctx); logger.V(5).Enabled() {
		logger.V(5).Info("GpuFragmentation model", "pod", klog.KObj(pod), "classes", len(classes))
	}
	return nil
}

// observe counts a pod once (by UID); the set of seen UIDs is dropped when it grows past a
// few windows, so a long-running scheduler does not keep every pod it ever saw.
func (p *Plugin) observe(pod *v1.Pod) {
	if _, ok := p.seen[pod.UID]; ok {
		return
	}
	if len(p.seen) >= 4*p.config.window {
		p.seen = map[types.UID]struct{}{}
	}
	p.seen[pod.UID] = struct{}{}
	p.learner.Observe(p.PodAmounts(pod))
}

// Score is the placement's cost on the node, scaled to an integer; NormalizeScore turns it
// into 0..MaxNodeScore, the lowest cost best.
func (p *Plugin) Score(_ context.Context, state fwk.CycleState, _ *v1.Pod, node fwk.NodeInfo) (int64, *fwk.Status) {
	s, err := readState(state)
	if err != nil {
		return 0, fwk.AsStatus(err)
	}
	return int64(math.Round(s.model.Cost(p.Free(node), s.pod) * costScale)), nil
}

// ScoreExtensions: NormalizeScore.
func (p *Plugin) ScoreExtensions() fwk.ScoreExtensions { return p }

// NormalizeScore maps the costs onto 0..MaxNodeScore, the lowest cost scoring MaxNodeScore.
func (p *Plugin) NormalizeScore(_ context.Context, _ fwk.CycleState, _ *v1.Pod, scores fwk.NodeScoreList) *fwk.Status {
	costs := make([]float64, len(scores))
	for i, s := range scores {
		costs[i] = float64(s.Score) / costScale
	}
	for i, s := range Normalize(costs, fwk.MaxNodeScore) {
		scores[i].Score = s
	}
	return nil
}

func readState(state fwk.CycleState) (*cycleState, error) {
	data, err := state.Read(stateKey)
	if err != nil {
		return nil, fmt.Errorf("reading %q from the cycle state: %w", stateKey, err)
	}
	s, ok := data.(*cycleState)
	if !ok {
		return nil, fmt.Errorf("%q in the cycle state is a %T", stateKey, data)
	}
	return s, nil
}
