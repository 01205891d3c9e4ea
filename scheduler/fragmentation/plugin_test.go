package fragmentation

import (
	"context"
	"strconv"
	"strings"
	"testing"

	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/runtime"
	fwk "k8s.io/kube-scheduler/framework"
	"k8s.io/kubernetes/pkg/scheduler/backend/cache"
	"k8s.io/kubernetes/pkg/scheduler/framework"
	frameworkruntime "k8s.io/kubernetes/pkg/scheduler/framework/runtime"
	st "k8s.io/kubernetes/pkg/scheduler/testing"
)

func ptr[T any](v T) *T { return &v }

func TestParseArgs(t *testing.T) {
	c, err := ParseArgs(Args{})
	if err != nil {
		t.Fatal(err)
	}
	if len(c.gpuResources) != 1 || c.gpuResources[0] != DefaultGPUResource ||
		c.maxClasses != DefaultMaxClasses || c.priorWeight != DefaultPriorWeight || c.window != DefaultWindow {
		t.Errorf("defaults = %+v", c)
	}
	for _, tc := range []struct {
		args Args
		want string
	}{
		{Args{GPUResources: []string{"cpu"}}, `gpuResources contains "cpu"; expected extended resource names`},
		{Args{MaxClasses: ptr(0)}, "maxClasses is 0; expected 1 to 1024"},
		{Args{PriorWeight: ptr(-0.1)}, "priorWeight is -0.1; expected 0 (no priors) to 1"},
		{Args{Window: ptr(1)}, "window is 1; expected at least 2 pods"},
	} {
		if _, err := ParseArgs(tc.args); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("ParseArgs(%+v) = %v, want an error containing %q", tc.args, err, tc.want)
		}
	}
}

func TestNewDecodesArgs(t *testing.T) {
	raw := &runtime.Unknown{Raw: []byte(`{"gpuResources": ["nvidia.com/gpu", "nvidia.com/gpu.shared"], "priorWeight": 0}`)}
	p, err := New(context.Background(), raw, nil)
	if err != nil {
		t.Fatal(err)
	}
	c := p.(*Plugin).config
	if len(c.gpuResources) != 2 || c.priorWeight != 0 {
		t.Errorf("decoded config %+v", c)
	}
	if _, err := New(context.Background(), &runtime.Unknown{Raw: []byte(`{"window": 1}`)}, nil); err == nil ||
		!strings.Contains(err.Error(), "window is 1") {
		t.Errorf("bad args: %v", err)
	}
}

func gpuNode(name string, gpus int, cpu, mem string) *v1.Node {
	return st.MakeNode().Name(name).Capacity(map[v1.ResourceName]string{
		v1.ResourceCPU: cpu, v1.ResourceMemory: mem, v1.ResourcePods: "110", DefaultGPUResource: strconv.Itoa(gpus),
	}).Obj()
}

func gpuPod(name, node string, gpus int, cpu, mem string) *v1.Pod {
	req := map[v1.ResourceName]string{v1.ResourceCPU: cpu, v1.ResourceMemory: mem}
	if gpus > 0 {
		req[DefaultGPUResource] = strconv.Itoa(gpus)
	}
	return st.MakePod().Name(name).UID(name).Node(node).Req(req).Obj()
}

// scores runs PreScore, Score and NormalizeScore for pod over the snapshot's nodes.
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
		if n.Node() == nil || !fits(p, pod, n) { // filtered out
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

// fits: the pod's GPUs, cpu and memory fit the node (NodeResourcesFit's filter, in short).
func fits(p *Plugin, pod *v1.Pod, node fwk.NodeInfo) bool {
	free, req := p.Free(node), p.PodAmounts(pod)
	return req.GPUs <= free.GPUs && req.MilliCPU <= free.MilliCPU && req.Memory <= free.Memory
}

func newPlugin(t *testing.T, snapshot *cache.Snapshot, args Args) *Plugin {
	t.Helper()
	ctx := context.Background()
	handle, err := frameworkruntime.NewFramework(ctx, nil, nil, frameworkruntime.WithSnapshotSharedLister(snapshot))
	if err != nil {
		t.Fatal(err)
	}
	p, err := New(ctx, nil, handle)
	if err != nil {
		t.Fatal(err)
	}
	plugin := p.(*Plugin)
	if plugin.config, err = ParseArgs(args); err != nil {
		t.Fatal(err)
	}
	return plugin
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
