package fragmentation

import (
	"context"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"strconv"
	"strings"
	"testing"

	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/informers"
	clientsetfake "k8s.io/client-go/kubernetes/fake"
	fwk "k8s.io/kube-scheduler/framework"
	schedconfig "k8s.io/kubernetes/pkg/scheduler/apis/config"
	"k8s.io/kubernetes/pkg/scheduler/backend/cache"
	"k8s.io/kubernetes/pkg/scheduler/framework"
	"k8s.io/kubernetes/pkg/scheduler/framework/plugins/defaultbinder"
	"k8s.io/kubernetes/pkg/scheduler/framework/plugins/queuesort"
	frameworkruntime "k8s.io/kubernetes/pkg/scheduler/framework/runtime"
	"k8s.io/kubernetes/pkg/scheduler/metrics"
	st "k8s.io/kubernetes/pkg/scheduler/testing"
)

func ptr[T any](v T) *T { return &v }

func TestParseArgs(t *testing.T) {
	c, err := ParseArgs(Args{})
	if err != nil {
		t.Fatal(err)
	}
	if len(c.gpuResources) != 1 || c.gpuResources[0] != DefaultGPUResource ||
		c.maxClasses != DefaultMaxClasses || c.priorWeight != DefaultPriorWeight || c.window != DefaultWindow ||
		c.migPrefix != DefaultMIGResourcePrefix || c.migSlices != DefaultMIGSlices ||
		c.maxPriorClasses != DefaultMaxPriorClasses || c.unit != DefaultMIGSlices || len(c.shared) != 0 {
		t.Errorf("defaults = %+v", c)
	}
	shared := func(name string, replicas int) []SharedResource {
		return []SharedResource{{Name: name, Replicas: replicas}}
	}
	for _, tc := range []struct {
		args Args
		want string
	}{
		{Args{GPUResources: []string{"cpu"}}, `gpuResources contains "cpu"; expected extended resource names`},
		{Args{MaxClasses: ptr(0)}, "maxClasses is 0; expected 1 to 1024"},
		{Args{PriorWeight: ptr(-0.1)}, "priorWeight is -0.1; expected 0 (no priors) to 1"},
		{Args{Window: ptr(1)}, "window is 1; expected at least 2 pods"},
		{Args{MaxPriorClasses: ptr(0)}, "maxPriorClasses is 0; expected 1 to 256"},
		{Args{MIGSlices: ptr(9)}, "migSlices is 9; expected 1 to 8"},
		{Args{MIGResourcePrefix: ptr("mig-")}, `migResourcePrefix is "mig-"; expected a resource name prefix with its domain`},
		{Args{SharedResources: shared("memory", 4)}, `sharedResources[0].name is "memory"; expected an extended resource name`},
		{Args{SharedResources: shared("nvidia.com/gpu.shared", 0)}, "sharedResources[0].replicas is 0; expected 1 to 1024"},
		{Args{SharedResources: shared("nvidia.com/mig-1g.10gb", 2)}, `sharedResources[0].name is "nvidia.com/mig-1g.10gb", under migResourcePrefix`},
		{Args{SharedResources: append(shared("a.com/x", 2), shared("a.com/x", 3)...)}, `sharedResources[1].name is "a.com/x", as is sharedResources[0].name`},
		{
			Args{SharedResources: []SharedResource{{"a.com/a", 1021}, {"a.com/b", 1019}}},
			"sharedResources[1].replicas is 1019, which with the other replicas and migSlices makes a GPU",
		},
	} {
		if _, err := ParseArgs(tc.args); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("ParseArgs(%+v) = %v, want an error containing %q", tc.args, err, tc.want)
		}
	}
}

func TestParseArgsResourceNames(t *testing.T) {
	c, err := ParseArgs(Args{
		GPUResources:    []string{"nvidia.com/gpu", "nvidia.com/gpu.shared", "nvidia.com/mig-1g.10gb"},
		SharedResources: []SharedResource{{Name: "nvidia.com/gpu.shared", Replicas: 4}},
	})
	if err != nil {
		t.Fatal(err)
	}
	// gpu.shared is shared (its replicas say so), the MIG profile is a slice (its prefix says so).
	if len(c.gpuResources) != 1 || c.gpuResources[0] != "nvidia.com/gpu" || len(c.shared) != 1 || c.unit != 28 {
		t.Errorf("config %+v; want nvidia.com/gpu whole, gpu.shared shared, a GPU 28 units (lcm of 7 and 4)", c)
	}
	c, err = ParseArgs(Args{SharedResources: []SharedResource{{Name: "nvidia.com/gpu", Replicas: 4}}, MIGResourcePrefix: ptr("")})
	if err != nil {
		t.Fatal(err)
	}
	if len(c.gpuResources) != 0 || c.unit != 4 {
		t.Errorf("time-slicing without renaming: config %+v; want nvidia.com/gpu shared only, a GPU 4 units", c)
	}
}

func TestNewDecodesArgs(t *testing.T) {
	raw := &runtime.Unknown{Raw: []byte(`{"gpuResources": ["nvidia.com/gpu", "nvidia.com/gpu.shared"], "priorWeight": 0,
		"sharedResources": [{"name": "nvidia.com/gpu.shared", "replicas": 8}], "migResourcePrefix": "example.com/mig-",
		"migSlices": 4, "maxPriorClasses": 3}`)}
	p, err := New(context.Background(), raw, nil)
	if err != nil {
		t.Fatal(err)
	}
	c := p.(*Plugin).config
	if len(c.gpuResources) != 1 || c.priorWeight != 0 || len(c.shared) != 1 || c.shared[0].replicas != 8 ||
		c.migPrefix != "example.com/mig-" || c.migSlices != 4 || c.maxPriorClasses != 3 {
		t.Errorf("decoded config %+v", c)
	}
	if _, err := New(context.Background(), &runtime.Unknown{Raw: []byte(`{"window": 1}`)}, nil); err == nil ||
		!strings.Contains(err.Error(), "window is 1") {
		t.Errorf("bad args: %v", err)
	}
}

func node(name string, res map[v1.ResourceName]string) *v1.Node {
	all := map[v1.ResourceName]string{v1.ResourcePods: "110"}
	for k, v := range res {
		all[k] = v
	}
	return st.MakeNode().Name(name).Capacity(all).Obj()
}

func gpuNode(name string, gpus int, cpu, mem string) *v1.Node {
	return node(name, map[v1.ResourceName]string{v1.ResourceCPU: cpu, v1.ResourceMemory: mem, DefaultGPUResource: strconv.Itoa(gpus)})
}

func podOn(name, node string, req map[v1.ResourceName]string) *v1.Pod {
	return st.MakePod().Name(name).UID(name).Node(node).Req(req).Obj()
}

func gpuPod(name, node string, gpus int, cpu, mem string) *v1.Pod {
	req := map[v1.ResourceName]string{v1.ResourceCPU: cpu, v1.ResourceMemory: mem}
	if gpus > 0 {
		req[DefaultGPUResource] = strconv.Itoa(gpus)
	}
	return podOn(name, node, req)
}

var daemonSet = schema.GroupVersionKind{Group: "apps", Version: "v1", Kind: "DaemonSet"}

// daemonPod is a DaemonSet's pod on node.
func daemonPod(name, node, cpu, mem string) *v1.Pod {
	pod := podOn(name, node, map[v1.ResourceName]string{v1.ResourceCPU: cpu, v1.ResourceMemory: mem})
	pod.OwnerReferences = st.MakePod().OwnerReference(name, daemonSet).Obj().OwnerReferences
	return pod
}

// staticPod is the mirror of a static pod on node.
func staticPod(name, node, cpu, mem string) *v1.Pod {
	pod := podOn(name, node, map[v1.ResourceName]string{v1.ResourceCPU: cpu, v1.ResourceMemory: mem})
	pod.Annotations = map[string]string{v1.MirrorPodAnnotationKey: "hash"}
	return pod
}

// scores runs PreScore, Score and NormalizeScore for pod over the snapshot's nodes that fit it.
func scores(t *testing.T, p *Plugin, pod *v1.Pod, snapshot *cache.Snapshot) map[string]int64 {
	t.Helper()
	ctx := context.Background()
	nodes, err := snapshot.NodeInfos().List()
	if err != nil {
		t.Fatal(err)
	}
	state := framework.NewCycleState()
	if s := p.PreScore(ctx, state, pod, nodes); !s.IsSuccess() {
		t.Fatalf("PreScore: %v", s)
	}
	var list fwk.NodeScoreList
	for _, n := range nodes {
		if n.Node() == nil || !fits(pod, n) { // filtered out
			continue
		}
		score, s := p.Score(ctx, state, pod, n)
		if !s.IsSuccess() {
			t.Fatalf("Score(%s): %v", n.Node().Name, s)
		}
		list = append(list, fwk.NodeScore{Name: n.Node().Name, Score: score})
	}
	if s := p.NormalizeScore(ctx, state, pod, list); !s.IsSuccess() {
		t.Fatalf("NormalizeScore: %v", s)
	}
	out := map[string]int64{}
	for _, s := range list {
		out[s.Name] = s.Score
	}
	return out
}

func TestScoresOverTheSnapshot(t *testing.T) {
	// big: the only node a whole-node 8-GPU pod with 120 cores fits. used: an 8-GPU node that
	// already runs a 4-GPU pod. The bound pods seed the model: three 1-GPU pods and one
	// 8-GPU pod with 120 cores (which ran on a node since gone).
	nodes := []*v1.Node{
		gpuNode("big", 8, "128", "768Gi"),
		gpuNode("used", 8, "96", "384Gi"),
		gpuNode("cpu-only", 0, "64", "256Gi"),
	}
	pods := []*v1.Pod{gpuPod("four", "used", 4, "48", "128Gi")}
	for _, name := range []string{"a", "b", "c"} {
		pods = append(pods, gpuPod(name, "gone", 1, "8", "32Gi"))
	}
	pods = append(pods, gpuPod("eight", "gone", 8, "120", "300Gi"))
	snapshot := cache.NewSnapshot(pods, nodes)
	p := newPlugin(t, snapshot, Args{})

	got := scores(t, p, gpuPod("new", "", 1, "8", "32Gi"), snapshot)
	if got["used"] <= got["big"] {
		t.Errorf("1-GPU pod: scores %v; want the used node best, the whole 8-GPU node kept", got)
	}
	got = scores(t, p, gpuPod("web", "", 0, "16", "64Gi"), snapshot)
	if got["cpu-only"] != 100 || got["big"] >= 100 || got["used"] >= 100 {
		t.Errorf("CPU-only pod: scores %v; want the node without GPUs best", got)
	}
	if n := p.learner.total; n != 6 {
		t.Errorf("learned from %v GPU pods, want 6 (5 bound, the new one; a pod is counted once)", n)
	}
}

// System pods (DaemonSets', static pods') run on every node whatever is scheduled; what they
// request must not make a whole node look broken to the whole-node prior.
func TestSystemPodsKeepWholeNodePrior(t *testing.T) {
	for _, tc := range []struct {
		name   string
		pods   func(node string) []*v1.Pod
		wholes bool // the idle node is room for its machine model's whole-node class
	}{
		{"no system pods", func(string) []*v1.Pod { return nil }, true},
		{"a DaemonSet pod with 50m of cpu", func(n string) []*v1.Pod {
			return []*v1.Pod{daemonPod("proxy-"+n, n, "50m", "0")}
		}, true},
		{"DaemonSet and static pods with cpu and memory", func(n string) []*v1.Pod {
			return []*v1.Pod{
				daemonPod("exporter-"+n, n, "300m", "512Mi"),
				daemonPod("dcgm-"+n, n, "100m", "128Mi"),
				staticPod("etcd-"+n, n, "250m", "1Gi"),
			}
		}, true},
		{"a pod of a Deployment breaks the node", func(n string) []*v1.Pod {
			return []*v1.Pod{gpuPod("web-"+n, n, 0, "50m", "0")}
		}, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			// Two nodes of one machine model; used runs a 4-GPU pod, big is idle.
			nodes := []*v1.Node{gpuNode("big", 8, "128", "768Gi"), gpuNode("used", 8, "128", "768Gi")}
			pods := []*v1.Pod{gpuPod("four", "used", 4, "48", "128Gi")}
			for _, n := range nodes {
				pods = append(pods, tc.pods(n.Name)...)
			}
			snapshot := cache.NewSnapshot(pods, nodes)
			p := newPlugin(t, snapshot, Args{})
			m := prescore(t, p, gpuPod("probe", "", 1, "8", "32Gi"), snapshot)
			// The 8-GPU whole-node prior is the class with the most GPUs.
			var most, room int64
			for _, c := range m.Classes {
				most = max(most, c.Shape.GPUs)
			}
			for i, c := range m.Classes {
				if c.Shape.GPUs == most {
					room += m.Supply[i]
				}
			}
			if got := room > 0; got != tc.wholes {
				t.Errorf("classes %+v, supply %v; want room for a whole-node pod: %v", m.Classes, m.Supply, tc.wholes)
			}
			if !tc.wholes {
				return
			}
			got := scores(t, p, gpuPod("new", "", 1, "8", "32Gi"), snapshot)
			if got["used"] <= got["big"] {
				t.Errorf("1-GPU pod: scores %v; want the used node best, the whole 8-GPU node kept", got)
			}
		})
	}
}

// Kubelets of one machine model report allocatable memory a few MiB apart; the priors must
// stay one class per model and the classes bounded whatever the fleet.
func TestPriorsBoundedOnUnevenNodes(t *testing.T) {
	rng := rand.New(rand.NewPCG(5, 6))
	for _, tc := range []struct {
		name       string
		models     int // machine models, each 8 GPUs with its own cpu
		nodes      int
		maxClasses int // learned (1) and priors together
	}{
		{"one machine model", 1, 300, 1 + 1},
		{"two machine models", 2, 300, 1 + 2},
		{"forty machine models: capped", 40, 400, 1 + DefaultMaxPriorClasses},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var nodes []*v1.Node
			var pods []*v1.Pod
			for i := range tc.nodes {
				name := fmt.Sprintf("n%d", i)
				mem := 768*1024 - rng.IntN(256) // MiB
				cores := 64 + 2*(i%tc.models)
				nodes = append(nodes, gpuNode(name, 8, strconv.Itoa(cores), fmt.Sprintf("%dMi", mem)))
				pods = append(pods, daemonPod("proxy-"+name, name, "100m", "64Mi"))
			}
			snapshot := cache.NewSnapshot(pods, nodes)
			m := prescore(t, newPlugin(t, snapshot, Args{}), gpuPod("probe", "", 1, "8", "32Gi"), snapshot)
			if len(m.Classes) > tc.maxClasses {
				t.Fatalf("%d classes, want at most %d", len(m.Classes), tc.maxClasses)
			}
			for i, c := range m.Classes[1:] {
				if c.Weight != DefaultPriorWeight {
					t.Errorf("prior %+v weight %v", c, c.Weight)
				}
				// Every node of its model is whole: room for one pod of the class each.
				if perModel := int64(tc.nodes / tc.models); tc.models <= DefaultMaxPriorClasses && m.Supply[1+i] < perModel {
					t.Errorf("prior %+v has supply %d; want the %d nodes of its model whole", c, m.Supply[1+i], perModel)
				}
			}
		})
	}
}

// A pod that fits one node is placed without scoring, and one that fits none is never
// scored: both reach PreFilter only, and both must be counted.
func TestArrivalsCountedForEveryPod(t *testing.T) {
	snapshot := cache.NewSnapshot(nil, []*v1.Node{gpuNode("only", 8, "16", "64Gi")})
	for _, tc := range []struct {
		name string
		pod  *v1.Pod
	}{
		{"fits one node", gpuPod("one", "", 8, "16", "64Gi")},
		{"fits no node", gpuPod("none", "", 16, "32", "64Gi")},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p := newPlugin(t, snapshot, Args{})
			pf, ok := any(p).(fwk.PreFilterPlugin)
			if !ok {
				t.Fatal("the plugin has no PreFilter: pods that are never scored are never counted")
			}
			for range 2 { // a retried pod is counted once
				if _, s := pf.PreFilter(context.Background(), framework.NewCycleState(), tc.pod, nil); !s.IsSuccess() && !s.IsSkip() {
					t.Fatalf("PreFilter: %v", s)
				}
			}
			m := prescore(t, p, gpuPod("next", "", 1, "1", "1Gi"), snapshot)
			want := p.PodAmounts(tc.pod).GPUs
			found := false
			for _, c := range m.Classes {
				found = found || (c.Shape.GPUs == want && c.Weight == 0.5)
			}
			if !found || p.learner.total != 2 {
				t.Errorf("classes %+v after %d pods; want the pod's %d GPUs at weight 1/2", m.Classes, int(p.learner.total), want)
			}
		})
	}
}

// After a restart (or when a standby takes over), the model starts from the bound and the
// pending pods the informers list, not from the bound ones alone.
func TestModelRebuiltFromBoundAndPendingPods(t *testing.T) {
	nodes := []*v1.Node{gpuNode("n1", 8, "128", "768Gi")}
	bound := []*v1.Pod{gpuPod("b1", "n1", 1, "8", "32Gi"), gpuPod("b2", "n1", 1, "8", "32Gi")}
	pending := []*v1.Pod{gpuPod("p1", "", 4, "32", "128Gi"), gpuPod("p2", "", 4, "32", "128Gi"), gpuPod("p3", "", 2, "8", "8Gi")}
	client := clientsetfake.NewClientset()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	for _, n := range nodes {
		if _, err := client.CoreV1().Nodes().Create(ctx, n, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	for _, pod := range append(append([]*v1.Pod{}, bound...), pending...) {
		pod.Namespace = "default"
		if _, err := client.CoreV1().Pods("default").Create(ctx, pod, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	factory := informers.NewSharedInformerFactory(client, 0)
	snapshot := cache.NewSnapshot(bound, nodes)
	p := newPlugin(t, snapshot, Args{}, frameworkruntime.WithInformerFactory(factory))
	factory.Start(ctx.Done())
	factory.WaitForCacheSync(ctx.Done())

	m := prescore(t, p, gpuPod("new", "", 1, "8", "32Gi"), snapshot)
	if n := p.learner.total; n != 6 {
		t.Errorf("learned from %v pods, want 6: 2 bound, 3 pending, the new one", n)
	}
	weights := map[int64]float64{} // GPUs -> weight
	for _, c := range m.Classes {
		weights[c.Shape.GPUs] += c.Weight
	}
	one, four, two := p.PodAmounts(bound[0]).GPUs, p.PodAmounts(pending[0]).GPUs, p.PodAmounts(pending[2]).GPUs
	if weights[one] < 0.5 || weights[four] < 2.0/6 || weights[two] < 1.0/6 {
		t.Errorf("classes %+v; want the 1-GPU shape at 3/6, the pending 4-GPU at 2/6 and 2-GPU at 1/6", m.Classes)
	}
}

// The profile the renderer writes enables the plugin at PreFilter, PreScore, Score and
// Reserve; kube-scheduler's framework must accept it there and run it as the scheduler does: a
// pod that fits one node goes from PreFilter straight to Reserve, and is counted all the same.
func TestFrameworkRunsEveryExtensionPoint(t *testing.T) {
	metrics.Register() // the framework counts plugin runs in kube-scheduler's metrics
	ctx := context.Background()
	snapshot := cache.NewSnapshot(nil, []*v1.Node{gpuNode("big", 8, "128", "768Gi"), gpuNode("small", 2, "32", "128Gi")})
	var plugin *Plugin
	registry := frameworkruntime.Registry{
		Name: func(ctx context.Context, obj runtime.Object, h fwk.Handle) (fwk.Plugin, error) {
			p, err := New(ctx, obj, h)
			plugin, _ = p.(*Plugin)
			return p, err
		},
		queuesort.Name:     queuesort.New,
		defaultbinder.Name: defaultbinder.New,
	}
	enabled := schedconfig.PluginSet{Enabled: []schedconfig.Plugin{{Name: Name}}}
	profile := &schedconfig.KubeSchedulerProfile{
		SchedulerName: "fragmentation",
		Plugins: &schedconfig.Plugins{
			QueueSort: schedconfig.PluginSet{Enabled: []schedconfig.Plugin{{Name: queuesort.Name}}},
			PreFilter: enabled, PreScore: enabled, Reserve: enabled,
			Score: schedconfig.PluginSet{Enabled: []schedconfig.Plugin{{Name: Name, Weight: 10}}},
			Bind:  schedconfig.PluginSet{Enabled: []schedconfig.Plugin{{Name: defaultbinder.Name}}},
		},
		PluginConfig: []schedconfig.PluginConfig{{Name: Name, Args: &runtime.Unknown{Raw: []byte(`{"gpuResources": ["nvidia.com/gpu"]}`)}}},
	}
	f, err := frameworkruntime.NewFramework(ctx, registry, profile, frameworkruntime.WithSnapshotSharedLister(snapshot))
	if err != nil {
		t.Fatal(err)
	}
	nodes, _ := snapshot.NodeInfos().List()

	// Only big fits 8 GPUs: no scoring, straight to Reserve.
	state := framework.NewCycleState()
	if _, s, _ := f.RunPreFilterPlugins(ctx, state, gpuPod("eight", "", 8, "64", "256Gi")); !s.IsSuccess() {
		t.Fatalf("PreFilter: %v", s)
	}
	if s := f.RunReservePluginsReserve(ctx, state, gpuPod("eight", "big", 8, "64", "256Gi"), "big"); !s.IsSuccess() {
		t.Fatalf("Reserve: %v", s)
	}
	if _, marked := plugin.marks.nodes["big"]; !marked {
		t.Errorf("Reserve on big did not mark it for the next cycle")
	}
	// A 1-GPU pod fits both and is scored: the small node, keeping big whole.
	state = framework.NewCycleState()
	one := gpuPod("one", "", 1, "8", "32Gi")
	if _, s, _ := f.RunPreFilterPlugins(ctx, state, one); !s.IsSuccess() {
		t.Fatalf("PreFilter: %v", s)
	}
	if s := f.RunPreScorePlugins(ctx, state, one, nodes); !s.IsSuccess() {
		t.Fatalf("PreScore: %v", s)
	}
	scored, s := f.RunScorePlugins(ctx, state, one, nodes)
	if !s.IsSuccess() {
		t.Fatalf("Score: %v", s)
	}
	got := map[string]int64{}
	for _, n := range scored {
		got[n.Name] = n.TotalScore
	}
	if got["small"] != 10*fwk.MaxNodeScore || got["big"] >= got["small"] {
		t.Errorf("scores %v; want small %d (weight 10), big lower", got, 10*fwk.MaxNodeScore)
	}
	if plugin.learner.total != 2 {
		t.Errorf("learned from %v pods, want 2: the 8-GPU pod that was never scored, the 1-GPU one", plugin.learner.total)
	}
}

// MIG devices (mig.strategy mixed) are GPU slices: MIG pods are GPU pods and MIG nodes have
// GPUs, so a CPU-only pod keeps off the cpu their free slices need.
func TestMIGNodesAreNotGPUless(t *testing.T) {
	const slice = "nvidia.com/mig-1g.10gb"
	nodes := []*v1.Node{
		node("mig", map[v1.ResourceName]string{v1.ResourceCPU: "16", v1.ResourceMemory: "128Gi", slice: "7"}),
		node("cpu", map[v1.ResourceName]string{v1.ResourceCPU: "16", v1.ResourceMemory: "128Gi"}),
	}
	var pods []*v1.Pod
	for i := range 3 {
		pods = append(pods, podOn(fmt.Sprintf("s%d", i), "gone", map[v1.ResourceName]string{v1.ResourceCPU: "2", v1.ResourceMemory: "8Gi", slice: "1"}))
	}
	snapshot := cache.NewSnapshot(pods, nodes)
	p := newPlugin(t, snapshot, Args{})
	got := scores(t, p, gpuPod("web", "", 0, "12", "16Gi"), snapshot)
	if got["cpu"] != 100 || got["mig"] >= 100 {
		t.Errorf("CPU-only pod: scores %v; want the node without MIG slices best", got)
	}
	if n := p.learner.total; n != 3 {
		t.Errorf("learned from %v MIG pods, want 3", n)
	}
}

// A shared replica (time-slicing, MPS) is a fraction of a GPU, not a GPU.
func TestSharedReplicaIsAFraction(t *testing.T) {
	raw := `{"gpuResources": ["nvidia.com/gpu", "nvidia.com/gpu.shared"],
		"sharedResources": [{"name": "nvidia.com/gpu.shared", "replicas": 4}]}`
	p := newPlugin(t, cache.NewEmptySnapshot(), json.RawMessage(raw))
	whole := p.PodAmounts(gpuPod("whole", "", 1, "1", "1Gi"))
	shared := p.PodAmounts(podOn("shared", "", map[v1.ResourceName]string{v1.ResourceCPU: "1", "nvidia.com/gpu.shared": "1"}))
	if shared.GPUs <= 0 || 4*shared.GPUs != whole.GPUs {
		t.Errorf("one replica is %d units, one GPU %d; want a quarter", shared.GPUs, whole.GPUs)
	}
}

// recount is the model of classes counted from scratch over every node of the snapshot.
func recount(c *cluster, p *Plugin, classes []Class) *Model {
	all, _ := c.snapshot.NodeInfos().List()
	var free []Room
	var gpus []int64
	for _, n := range all {
		if n.Node() != nil {
			alloc := p.res.room(n.GetAllocatable())
			free = append(free, p.Free(n))
			gpus = append(gpus, alloc.TotalGPUs())
		}
	}
	return NewModel(classes, free, gpus)
}

// The fleet's supplies, kept up to date node by node from events and the sweep, must be what a
// recount over the snapshot gives, cycle after cycle, on the scheduler's own cache.
func TestSupplyFollowsTheSnapshot(t *testing.T) {
	for _, tc := range []struct {
		name   string
		events bool // changes are announced (Reserve, informer events); else the sweep finds them
	}{
		{"changes announced", true},
		{"no events: the sweep and the node count find them", false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			c := newCluster(ctx, t, 150, true, 7)
			p := newPlugin(t, c.snapshot, Args{})
			c.fill(t, p, 0.3)
			for cycle := range 400 {
				for range 1 + c.rng.IntN(3) {
					c.change(p, tc.events)
				}
				c.sync(t)
				if !tc.events {
					if cycle%20 != 19 {
						prescore(t, p, c.pod(), c.snapshot)
						continue
					}
					// Without events, a changed node is found within nodes/sweepNodes cycles.
					for range (len(c.nodes)+sweepNodes-1)/sweepNodes + 1 {
						prescore(t, p, c.pod(), c.snapshot)
					}
				}
				m := prescore(t, p, c.pod(), c.snapshot)
				want := recount(c, p, m.Classes)
				if fmt.Sprint(m.Supply, m.MaxGPUs) != fmt.Sprint(want.Supply, want.MaxGPUs) {
					t.Fatalf("cycle %d: supply %v, max GPUs %d; a recount over the snapshot gives %v, %d",
						cycle, m.Supply, m.MaxGPUs, want.Supply, want.MaxGPUs)
				}
			}
		})
	}
}
