// Package fragmentation is GpuFragmentation, a kube-scheduler score plugin that places each pod
// where it uses up the least of the room the cluster still has for the GPU pod shapes that
// arrive, in the spirit of FGD (Weng et al., "Beware of Fragmentation: Scheduling GPU-Sharing
// Workloads with Fragmentation Gradient Descent", USENIX ATC'23), adapted to GPUs of several
// kinds (whole, shared replicas, MIG slices) and to the cpu and memory those pods need beside
// them.
//
// The workload model is learned from every pod the scheduler tries to place (PreFilter, so a
// pod that fits one node or none counts too) and, when it starts or takes over, from the bound
// and pending pods; before a shape has been seen, one prior class per machine model (a pod
// taking the whole node, less what its DaemonSet and static pods request) keeps a node only
// such a pod fits from being broken up first. Each class's supply over the cluster is kept up
// to date node by node (fleet.go, refresh.go), so a cycle costs what changed, not the fleet's
// size. See model.go for the cost and bench/README.md for the numbers. A member of a gang
// (a PodGroup with a gang policy, GenericWorkload) also counts its gang's pending members:
// gang.go. GPUs under Dynamic Resource Allocation (ResourceSlices, ResourceClaims, extended
// resources a DeviceClass maps) count as counted GPUs do: dra.go.
//
// The plugin needs the whole cluster's free room in every cycle, so it does not sign pods for
// opportunistic batching (KEP-5598): a pod's best node depends on more than the pod.
package fragmentation

import (
	"context"
	"fmt"
	"math"
	"slices"
	"sync"

	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	corelisters "k8s.io/client-go/listers/core/v1"
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

// Plugin is the GpuFragmentation plugin: it learns at PreFilter, builds the model at
// PreScore, scores at Score, and hears of its own placements at Reserve. Only PreScore and
// Score are needed; without PreFilter it learns at PreScore, without Reserve (and the
// informers) it finds changed nodes by its round-robin sweep alone.
type Plugin struct {
	handle fwk.Handle
	config config
	res    *resources
	pods   corelisters.PodLister // nil without an informer factory
	marks  marks
	*draTracker

	mu       sync.Mutex
	learner  *Learner
	seen     map[types.UID]struct{}
	seeded   bool
	fleet    *Fleet
	sim      simulated      // pods a pod group cycle placed in the snapshot only (gang.go)
	members  memberRequests // what the pending members of gangs request (gang.go)
	sweep    int            // the next node of the snapshot's list the sweep reads
	nodeless int            // listed NodeInfos without a Node at the last full pass
}

var (
	_ fwk.PreFilterPlugin   = &Plugin{}
	_ fwk.EnqueueExtensions = &Plugin{}
	_ fwk.PreScorePlugin    = &Plugin{}
	_ fwk.ScorePlugin       = &Plugin{}
	_ fwk.ScoreExtensions   = &Plugin{}
	_ fwk.ReservePlugin     = &Plugin{}
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
	return newWithConfig(handle, c)
}

func newWithConfig(handle fwk.Handle, c config) (*Plugin, error) {
	res := newResources(c)
	p := &Plugin{
		handle:     handle,
		config:     c,
		res:        res,
		draTracker: newDRATracker(handle, c, res),
		marks:      marks{nodes: map[string]int{}},
		learner:    NewLearner(c.window),
		seen:       map[types.UID]struct{}{},
		// Twice the classes of one model: shapes near the cut keep their supply.
		fleet: NewFleet(c.maxPriorClasses, 2*(c.maxClasses+c.maxPriorClasses)),
	}
	if handle != nil {
		if f := handle.SharedInformerFactory(); f != nil {
			if err := p.watch(f); err != nil {
				return nil, fmt.Errorf("%s: watching pods and nodes: %w", Name, err)
			}
		}
	}
	return p, nil
}

// Name of the plugin.
func (p *Plugin) Name() string { return Name }

type cycleState struct {
	model *Model
	pod   Amounts
	// follow is, for a gang member, the cost per node of the rest of its gang once it is
	// there (gang.go); nil for any other pod.
	follow map[string]float64
}

func (s *cycleState) Clone() fwk.StateData { return s }

// PodAmounts is what the pod requests: cpu, memory and GPU units of its GPU kind, counted
// GPU resources, DRA devices of its ResourceClaims and extended resources DRA backs (dra.go)
// alike.
func (p *Plugin) PodAmounts(pod *v1.Pod) Amounts {
	return p.amountsOf(pod, resourcehelper.PodRequests(pod, resourcehelper.PodResourcesOptions{}))
}

// amountsOf is PodAmounts of a pod whose requests (resourcehelper.PodRequests) are known.
func (p *Plugin) amountsOf(pod *v1.Pod, req v1.ResourceList) Amounts {
	return shape(p.res.amounts(req).Add(p.extendedDemand(req)).Add(p.claimDemand(pod)))
}

// Free is what a node has left: allocatable minus what its pods (bound and assumed) request,
// in the GPU resources the plugin has met (PreScore reads every node before Score asks), and
// its DRA GPUs that no claim holds.
func (p *Plugin) Free(node fwk.NodeInfo) Room {
	free := nodeFree(p.res.known(node.GetAllocatable()), p.res.known(node.GetRequested()))
	if n := node.Node(); n != nil {
		free = free.Add(p.draRoomOf(n.Name).free)
	}
	return free
}

// PreFilter counts the pod's shape, once per pod: every pod the scheduler tries to place,
// also one that fits a single node (which is never scored) or none.
func (p *Plugin) PreFilter(_ context.Context, state fwk.CycleState, pod *v1.Pod, _ []fwk.NodeInfo) (*fwk.PreFilterResult, *fwk.Status) {
	a := p.PodAmounts(pod)
	p.mu.Lock()
	p.seed()
	p.observe(pod.UID, a)
	p.mu.Unlock()
	state.Write(stateKey, &cycleState{pod: a}) // PreScore's model is added to it
	return nil, fwk.NewStatus(fwk.Skip)
}

// PreFilterExtensions: none, the plugin filters nothing.
func (p *Plugin) PreFilterExtensions() fwk.PreFilterExtensions { return nil }

// EventsToRegister: none, the plugin never rejects a pod, so no event makes one schedulable.
func (p *Plugin) EventsToRegister(context.Context) ([]fwk.ClusterEventWithHint, error) {
	return nil, nil
}

// PreScore brings the fleet up to date with the snapshot and builds the model: the learned
// classes and priors with their supply over every node (nodes the pod does not fit too). For
// a member of a gang, the model also holds the members still pending (gang.go).
func (p *Plugin) PreScore(ctx context.Context, state fwk.CycleState, pod *v1.Pod, nodes []fwk.NodeInfo) *fwk.Status {
	lister := p.handle.SnapshotSharedLister().NodeInfos()
	var podAmounts Amounts
	if s, err := readState(state); err == nil {
		podAmounts = s.pod // from PreFilter
	} else {
		podAmounts = p.PodAmounts(pod)
	}

	var same int
	var known []Class
	var needed []int64
	if podAmounts.GPUs > 0 {
		same, known, needed = knownDemand(p.gangPending(pod), podAmounts)
	}

	p.mu.Lock()
	if !isGroupCycle(state) {
		// Every pod group cycle undoes its placements before the next cycle starts: anything
		// left is stale (a profile without the plugin at Reserve, say), and the fleet never
		// counted it.
		p.sim = simulated{}
	}
	p.seed()
	p.observe(pod.UID, podAmounts) // a profile without the plugin at PreFilter learns here
	err := p.refresh(lister)
	var priors []Amounts
	if p.config.priorWeight > 0 {
		priors = p.fleet.Priors()
	}
	classes := p.learner.Classes(p.config.maxClasses, priors, p.config.priorWeight)
	var model *Model
	if err == nil && len(classes)+len(known) > 0 {
		model = p.fleet.Model(append(classes, known...))
		p.withSimulated(model)
		// The room the gang's other shapes need is theirs: the rest is what others can use.
		for i, n := range needed {
			c := len(classes) + i
			model.Supply[c] = max(model.Supply[c]-n, 0)
		}
	}
	p.mu.Unlock()

	if err != nil {
		return fwk.AsStatus(err)
	}
	if model == nil {
		return fwk.NewStatus(fwk.Skip)
	}
	s := &cycleState{model: model, pod: podAmounts}
	if same > 0 {
		frees := make([]Room, len(nodes))
		for i, n := range nodes {
			frees[i] = p.Free(n)
		}
		s.follow = make(map[string]float64, len(nodes))
		for i, cost := range model.Followers(podAmounts, same, frees) {
			if n := nodes[i].Node(); n != nil {
				s.follow[n.Name] = cost
			}
		}
	}
	state.Write(stateKey, s)
	if logger := klog.FromContext(ctx); logger.V(5).Enabled() {
		logger.V(5).Info("GpuFragmentation model", "pod", klog.KObj(pod), "classes", len(classes), "gangFollowers", same, "gangShapes", len(known))
	}
	return nil
}

// Reserve: the node the pod was placed on changed; the next cycle reads it again. A pod group
// cycle places the pod in its snapshot only: it is counted apart from the fleet (gang.go).
func (p *Plugin) Reserve(_ context.Context, state fwk.CycleState, pod *v1.Pod, nodeName string) *fwk.Status {
	if isGroupCycle(state) {
		p.simulate(pod, nodeName)
	}
	p.marks.mark(nodeName)
	p.dra.mark(nodeName) // DynamicResources' Reserve holds the pod's devices in its tracker
	return nil
}

// Unreserve: the placement was undone; the next cycle reads the node again.
func (p *Plugin) Unreserve(_ context.Context, state fwk.CycleState, pod *v1.Pod, nodeName string) {
	if isGroupCycle(state) {
		p.unsimulate(pod)
	}
	p.marks.mark(nodeName)
	p.dra.mark(nodeName)
}

// seed counts, once, the pods there already are: with the informers, every bound and pending
// pod (after a restart or a failover the model starts where the cluster is, not empty);
// without them, the pods bound in the snapshot.
func (p *Plugin) seed() {
	if p.seeded {
		return
	}
	p.seeded = true
	var pods []*v1.Pod
	if p.pods != nil {
		listed, err := p.pods.List(labels.Everything())
		if err != nil {
			klog.ErrorS(err, "GpuFragmentation: listing pods to learn from")
		}
		pods = listed
	} else if nodes, err := p.handle.SnapshotSharedLister().NodeInfos().List(); err == nil {
		for _, n := range nodes {
			for _, pi := range n.GetPods() {
				pods = append(pods, pi.GetPod())
			}
		}
	}
	// Oldest first: counts halve as they go, so the newest pods weigh most.
	slices.SortStableFunc(pods, func(a, b *v1.Pod) int {
		return a.CreationTimestamp.Time.Compare(b.CreationTimestamp.Time)
	})
	for _, pod := range pods {
		if pod.Status.Phase != v1.PodSucceeded && pod.Status.Phase != v1.PodFailed {
			p.observe(pod.UID, p.PodAmounts(pod))
		}
	}
}

// observe counts a GPU pod once (by UID); the set of seen UIDs is dropped when it grows past a
// few windows, so a long-running scheduler does not keep every pod it ever saw.
func (p *Plugin) observe(uid types.UID, a Amounts) {
	if a.GPUs <= 0 {
		return
	}
	if _, ok := p.seen[uid]; ok {
		return
	}
	if len(p.seen) >= 4*p.config.window {
		p.seen = map[types.UID]struct{}{}
	}
	p.seen[uid] = struct{}{}
	p.learner.Observe(a)
}

// Score is the placement's cost on the node, scaled to an integer; NormalizeScore turns it
// into 0..MaxNodeScore, the lowest cost best.
func (p *Plugin) Score(_ context.Context, state fwk.CycleState, _ *v1.Pod, node fwk.NodeInfo) (int64, *fwk.Status) {
	s, err := readState(state)
	if err != nil {
		return 0, fwk.AsStatus(err)
	}
	cost := s.model.Cost(p.Free(node), s.pod)
	if s.follow != nil {
		cost += s.follow[node.Node().Name]
	}
	return int64(math.Round(cost * costScale)), nil
}

// ScoreExtensions: NormalizeScore.
func (p *Plugin) ScoreExtensions() fwk.ScoreExtensions { return p }

// NormalizeScore maps the costs onto 0..MaxNodeScore (Normalize), the lowest cost scoring
// MaxNodeScore.
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

// systemPod: a pod a node runs whatever is scheduled on it, a DaemonSet's pod or a static
// pod's mirror; what it requests comes off the node's whole-node shape.
// Ref: https://kubernetes.io/docs/concepts/workloads/controllers/daemonset/
// Ref: https://kubernetes.io/docs/tasks/configure-pod-container/static-pod/
func systemPod(pod *v1.Pod) bool {
	if _, ok := pod.Annotations[v1.MirrorPodAnnotationKey]; ok {
		return true
	}
	ref := metav1.GetControllerOfNoCopy(pod)
	return ref != nil && ref.Kind == "DaemonSet"
}
