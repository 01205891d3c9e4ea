package fragmentation

import (
	"context"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"testing"

	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	"k8s.io/apimachinery/pkg/runtime"
	utilfeature "k8s.io/apiserver/pkg/util/feature"
	"k8s.io/klog/v2"
	fwk "k8s.io/kube-scheduler/framework"
	"k8s.io/kubernetes/pkg/features"
	"k8s.io/kubernetes/pkg/scheduler/backend/cache"
	"k8s.io/kubernetes/pkg/scheduler/framework"
	"k8s.io/kubernetes/pkg/scheduler/framework/plugins/noderesources"
	frameworkruntime "k8s.io/kubernetes/pkg/scheduler/framework/runtime"
	"k8s.io/kubernetes/pkg/scheduler/metrics"
)

// newPlugin builds the plugin as the scheduler does, from the args' JSON, on a framework
// reading the snapshot (and the informers, when given).
func newPlugin(t testing.TB, snapshot fwk.SharedLister, args any, opts ...frameworkruntime.Option) *Plugin {
	t.Helper()
	ctx := context.Background()
	handle, err := frameworkruntime.NewFramework(ctx, nil, nil, append(opts, frameworkruntime.WithSnapshotSharedLister(snapshot))...)
	if err != nil {
		t.Fatal(err)
	}
	raw, err := json.Marshal(args)
	if err != nil {
		t.Fatal(err)
	}
	p, err := New(ctx, &runtime.Unknown{Raw: raw}, handle)
	if err != nil {
		t.Fatal(err)
	}
	return p.(*Plugin)
}

// prescore runs PreScore for pod and returns the model it built.
func prescore(t testing.TB, p *Plugin, pod *v1.Pod, snapshot fwk.SharedLister) *Model {
	t.Helper()
	nodes, err := snapshot.NodeInfos().List()
	if err != nil {
		t.Fatal(err)
	}
	state := framework.NewCycleState()
	if s := p.PreScore(context.Background(), state, pod, nodes); !s.IsSuccess() {
		t.Fatalf("PreScore: %v", s)
	}
	s, err := readState(state)
	if err != nil {
		t.Fatal(err)
	}
	return s.model
}

// fits: NodeResourcesFit's filter lets the pod on the node.
func fits(pod *v1.Pod, node fwk.NodeInfo) bool {
	return len(noderesources.Fits(pod, node, nil, noderesources.ResourceRequestsOptions{})) == 0
}

// cluster is kube-scheduler's own cache and the snapshot it updates, changed the way a cluster
// changes: pods placed by this scheduler (assumed, then confirmed) or by another, pods
// deleted, nodes added, resized and removed, DaemonSet pods started. The plugin hears of each
// change as it would in kube-scheduler (Reserve for its own placements, the informers' events
// for every change), or, with events off, not at all. What it leaves out: the informers
// themselves (their handlers are called directly) and the binding API calls.
type cluster struct {
	cache    cache.Cache
	snapshot *cache.Snapshot
	rng      *rand.Rand
	logger   klog.Logger
	realism  bool // uneven allocatable and system pods on every node
	nodes    []*v1.Node
	bound    []*v1.Pod
	seq      int
}

// nodeType is a machine model: its GPUs (whole, or MIG 1g slices), cpu and memory.
type nodeType struct {
	share    int // in 100
	gpus     int
	migSlice bool
	cores    int
	memGiB   int
}

var nodeTypes = []nodeType{
	{40, 8, false, 128, 768}, {20, 8, false, 96, 384}, {15, 4, false, 64, 256},
	{10, 2, false, 32, 128}, {10, 0, false, 64, 256}, {5, 8, true, 128, 1024},
}

const migSlice = "nvidia.com/mig-1g.10gb"

// podShape is a workload pod shape and its share of the arrivals.
type podShape struct {
	share  int // in 100
	gpus   int
	slices int
	cpu    string
	mem    string
}

var podShapes = []podShape{
	{40, 1, 0, "8", "32Gi"}, {15, 1, 0, "4", "16Gi"}, {10, 2, 0, "16", "64Gi"}, {8, 4, 0, "32", "128Gi"},
	{5, 8, 0, "96", "300Gi"}, {17, 0, 0, "4", "16Gi"}, {5, 0, 1, "2", "8Gi"},
}

func newCluster(ctx context.Context, t testing.TB, nodes int, realism bool, seed uint64) *cluster {
	t.Helper()
	metrics.Register() // the cache reports its size as kube-scheduler's metrics (once)
	c := &cluster{
		cache:    cache.New(ctx, nil, utilfeature.DefaultFeatureGate.Enabled(features.GenericWorkload), false),
		snapshot: cache.NewEmptySnapshot(),
		rng:      rand.New(rand.NewPCG(seed, seed)),
		logger:   klog.FromContext(ctx),
		realism:  realism,
	}
	for range nodes {
		c.addNode(nil, false)
	}
	c.sync(t)
	return c
}

func pick[T any](rng *rand.Rand, items []T, share func(T) int) T {
	n := rng.IntN(100)
	for _, it := range items {
		if n -= share(it); n < 0 {
			return it
		}
	}
	return items[len(items)-1]
}

func (c *cluster) name(prefix string) string {
	c.seq++
	return fmt.Sprintf("%s%d", prefix, c.seq)
}

// newNode is a node of a random type; realistic nodes report allocatable as kubelets do: cpu
// less a reserve, memory less a reserve that varies by a few hundred MiB.
func (c *cluster) newNode(name string) *v1.Node {
	nt := pick(c.rng, nodeTypes, func(n nodeType) int { return n.share })
	cpu, mem := fmt.Sprint(nt.cores), fmt.Sprintf("%dGi", nt.memGiB)
	if c.realism {
		cpu = fmt.Sprintf("%dm", nt.cores*1000-500)
		mem = fmt.Sprintf("%dMi", nt.memGiB*1024-1024-c.rng.IntN(256))
	}
	res := map[v1.ResourceName]string{v1.ResourceCPU: cpu, v1.ResourceMemory: mem}
	switch {
	case nt.migSlice:
		res[migSlice] = fmt.Sprint(7 * nt.gpus)
	case nt.gpus > 0:
		res[DefaultGPUResource] = fmt.Sprint(nt.gpus)
	}
	return node(name, res)
}

// systemPods are the DaemonSet pods of a realistic node: kube-proxy, a CNI agent,
// node-exporter, and on GPU nodes dcgm-exporter and the device plugin.
func (c *cluster) systemPods(n *v1.Node) []*v1.Pod {
	if !c.realism {
		return nil
	}
	pods := []*v1.Pod{
		daemonPod("kube-proxy-"+n.Name, n.Name, "100m", "128Mi"),
		daemonPod("cni-"+n.Name, n.Name, "250m", "256Mi"),
		daemonPod("node-exporter-"+n.Name, n.Name, "50m", "64Mi"),
	}
	_, whole := n.Status.Allocatable[DefaultGPUResource]
	_, mig := n.Status.Allocatable[migSlice]
	if whole || mig {
		pods = append(pods, daemonPod("dcgm-"+n.Name, n.Name, "100m", "512Mi"), daemonPod("device-plugin-"+n.Name, n.Name, "50m", "64Mi"))
	}
	return pods
}

// pod is a new pending workload pod of a random shape.
func (c *cluster) pod() *v1.Pod {
	s := pick(c.rng, podShapes, func(s podShape) int { return s.share })
	req := map[v1.ResourceName]string{v1.ResourceCPU: s.cpu, v1.ResourceMemory: s.mem}
	if s.gpus > 0 {
		req[DefaultGPUResource] = fmt.Sprint(s.gpus)
	}
	if s.slices > 0 {
		req[migSlice] = fmt.Sprint(s.slices)
	}
	return podOn(c.name("pod-"), "", req)
}

func (c *cluster) sync(t testing.TB) {
	t.Helper()
	if err := c.cache.UpdateSnapshot(c.logger, c.snapshot); err != nil {
		t.Fatal(err)
	}
}

// notify is what the plugin hears of a change when events are on.
type notify struct {
	p      *Plugin
	events bool
}

func (n notify) pod(pod *v1.Pod) {
	if n.events {
		n.p.onPod(pod)
	}
}

func (n notify) node(node *v1.Node) {
	if n.events {
		n.p.onNode(node)
	}
}

// bind places pod on a random node it fits, as this scheduler (assume, Reserve, then the
// informer's confirmation) or as another one; false if no node tried fits it.
func (c *cluster) bind(n notify, pod *v1.Pod, own bool) bool {
	for range 20 {
		node := c.nodes[c.rng.IntN(len(c.nodes))]
		info, err := c.snapshot.Get(node.Name)
		if err != nil || !fits(pod, info) {
			continue
		}
		pod.Spec.NodeName = node.Name
		if own {
			if err := c.cache.AssumePod(c.logger, pod); err != nil {
				panic(err)
			}
			if n.events {
				n.p.Reserve(context.Background(), nil, pod, node.Name)
			}
		}
		if err := c.cache.AddPod(c.logger, pod); err != nil {
			panic(err)
		}
		n.pod(pod)
		c.bound = append(c.bound, pod)
		return true
	}
	return false
}

// remove deletes a random bound pod.
func (c *cluster) remove(n notify) {
	if len(c.bound) == 0 {
		return
	}
	i := c.rng.IntN(len(c.bound))
	pod := c.bound[i]
	c.bound[i] = c.bound[len(c.bound)-1]
	c.bound = c.bound[:len(c.bound)-1]
	if err := c.cache.RemovePod(c.logger, pod); err != nil {
		panic(err)
	}
	n.pod(pod)
}

func (c *cluster) addNode(p *Plugin, events bool) {
	node := c.newNode(c.name("node-"))
	c.cache.AddNode(c.logger, node)
	c.nodes = append(c.nodes, node)
	n := notify{p, events && p != nil}
	n.node(node)
	for _, pod := range c.systemPods(node) {
		if err := c.cache.AddPod(c.logger, pod); err != nil {
			panic(err)
		}
		n.pod(pod)
	}
}

// change makes one random change to the cluster.
func (c *cluster) change(p *Plugin, events bool) {
	n := notify{p, events}
	switch r := c.rng.IntN(100); {
	case r < 40:
		c.bind(n, c.pod(), r < 30)
	case r < 80:
		c.remove(n)
	case r < 85:
		c.addNode(p, events)
	case r < 90 && len(c.nodes) > 1:
		i := c.rng.IntN(len(c.nodes))
		node := c.nodes[i]
		c.nodes[i] = c.nodes[len(c.nodes)-1]
		c.nodes = c.nodes[:len(c.nodes)-1]
		if err := c.cache.RemoveNode(c.logger, node); err != nil {
			panic(err)
		}
		n.node(node)
	case r < 95:
		i := c.rng.IntN(len(c.nodes))
		resized := c.nodes[i].DeepCopy()
		mem := resized.Status.Allocatable[v1.ResourceMemory]
		mem.Sub(resource.MustParse("300Mi"))
		resized.Status.Allocatable[v1.ResourceMemory] = mem
		c.cache.UpdateNode(c.logger, c.nodes[i], resized)
		c.nodes[i] = resized
		n.node(resized)
	default:
		node := c.nodes[c.rng.IntN(len(c.nodes))]
		pod := daemonPod(c.name("agent-"), node.Name, "200m", "256Mi")
		if err := c.cache.AddPod(c.logger, pod); err != nil {
			panic(err)
		}
		n.pod(pod)
	}
}

// fill places pods until about share of the GPUs are taken (or pods stop fitting).
func (c *cluster) fill(t testing.TB, p *Plugin, share float64) {
	t.Helper()
	var total, used int64
	for _, node := range c.nodes {
		q := node.Status.Allocatable[DefaultGPUResource]
		total += q.Value()
	}
	for misses := 0; float64(used) < share*float64(total) && misses < 1000; {
		pod := c.pod()
		if !c.bind(notify{p, true}, pod, false) {
			misses++
			continue
		}
		for _, ctr := range pod.Spec.Containers {
			q := ctr.Resources.Requests[DefaultGPUResource]
			used += q.Value()
		}
	}
	c.sync(t)
}
