package fragmentation

import (
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"testing"

	v1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/util/validation"
	fwk "k8s.io/kube-scheduler/framework"
	schedconfig "k8s.io/kubernetes/pkg/scheduler/apis/config"
	"k8s.io/kubernetes/pkg/scheduler/framework"
	"k8s.io/kubernetes/pkg/scheduler/framework/plugins/feature"
	"k8s.io/kubernetes/pkg/scheduler/framework/plugins/noderesources"
	frameworkruntime "k8s.io/kubernetes/pkg/scheduler/framework/runtime"
)

// claimBinpack is GpuClaimBinpack on the environment's informers and DRA manager, with args;
// it returns once the plugin has every slice of the environment.
func (e *draEnv) claimBinpack(args ClaimBinpackArgs) *ClaimBinpack {
	e.t.Helper()
	handle, err := frameworkruntime.NewFramework(e.ctx, nil, nil, e.opts...)
	if err != nil {
		e.t.Fatal(err)
	}
	raw, err := json.Marshal(args)
	if err != nil {
		e.t.Fatal(err)
	}
	pl, err := NewClaimBinpack(e.ctx, &runtime.Unknown{Raw: raw}, handle)
	if err != nil {
		e.t.Fatal(err)
	}
	p := pl.(*ClaimBinpack)
	e.p.dra.mu.Lock()
	want := len(e.p.dra.slices)
	e.p.dra.mu.Unlock()
	e.until("GpuClaimBinpack has every slice", func() bool {
		p.dra.mu.Lock()
		defer p.dra.mu.Unlock()
		return len(p.dra.slices) == want
	})
	return p
}

// claimScores runs PreScore and Score over the candidates; nil when PreScore skips the pod.
func claimScores(t *testing.T, e *draEnv, p fwk.ScorePlugin, pre fwk.PreScorePlugin, pod *v1.Pod, candidates ...string) map[string]int64 {
	t.Helper()
	all, err := e.snapshot.NodeInfos().List()
	if err != nil {
		t.Fatal(err)
	}
	state := framework.NewCycleState()
	s := pre.PreScore(e.ctx, state, pod, all)
	if s.IsSkip() {
		return nil
	}
	if !s.IsSuccess() {
		t.Fatalf("PreScore: %v", s)
	}
	out := map[string]int64{}
	for _, name := range candidates {
		info, err := e.snapshot.NodeInfos().Get(name)
		if err != nil {
			t.Fatal(err)
		}
		score, st := p.Score(e.ctx, state, pod, info)
		if !st.IsSuccess() {
			t.Fatalf("Score(%s): %v", name, st)
		}
		out[name] = score
	}
	return out
}

// top is the best-scored node; of equal scores the first name.
func top(s map[string]int64) string {
	names := make([]string, 0, len(s))
	for n := range s {
		names = append(names, n)
	}
	slices.Sort(names)
	best := names[0]
	for _, n := range names[1:] {
		if s[n] > s[best] {
			best = n
		}
	}
	return best
}

func TestClaimBinpackScoresHowFullTheNodesGPUsWouldBe(t *testing.T) {
	e := newDRAEnv(t, []*v1.Node{draNode("a"), draNode("b")}, gpuSlice("a", 8, nil), gpuSlice("b", 8, nil), deviceClass(DRAGPUClass, ""))
	p := e.claimBinpack(ClaimBinpackArgs{})
	e.allocate(e.claimPod("held", DRAGPUClass, 3, ""), "a", "gpu-0", "gpu-1", "gpu-2")
	// 3 held + 1 of 8 on a: 50%; 1 of 8 on b: 12% (integer percent, as upstream).
	got := claimScores(t, e, p, p, e.claimPod("one", DRAGPUClass, 1, ""), "a", "b")
	if got["a"] != 50 || got["b"] != 12 {
		t.Errorf("scores %v, want a 50 and b 12", got)
	}
	// Two GPUs: 62% and 25%; more than a node has left scores as full.
	if got := claimScores(t, e, p, p, e.claimPod("two", DRAGPUClass, 2, ""), "a", "b"); got["a"] != 62 || got["b"] != 25 {
		t.Errorf("2-GPU scores %v, want a 62 and b 25", got)
	}
	if got := claimScores(t, e, p, p, e.claimPod("six", DRAGPUClass, 6, ""), "a"); got["a"] != 100 {
		t.Errorf("6 GPUs on a's 5 free = %v, want 100", got)
	}
}

func TestClaimBinpackFollowsTheProfilesShape(t *testing.T) {
	e := newDRAEnv(t, []*v1.Node{draNode("a"), draNode("b")}, gpuSlice("a", 8, nil), gpuSlice("b", 8, nil), deviceClass(DRAGPUClass, ""))
	// A falling shape spreads, a step packs only past half: the shape is the profile's, not fixed.
	spread := e.claimBinpack(ClaimBinpackArgs{Shape: []ShapePoint{{0, 10}, {100, 0}}})
	step := e.claimBinpack(ClaimBinpackArgs{Shape: []ShapePoint{{0, 0}, {50, 0}, {100, 10}}})
	e.allocate(e.claimPod("held", DRAGPUClass, 5, ""), "a", "gpu-0", "gpu-1", "gpu-2", "gpu-3", "gpu-4")
	pod := e.claimPod("one", DRAGPUClass, 1, "")
	if got := claimScores(t, e, spread, spread, pod, "a", "b"); got["a"] != 25 || got["b"] != 88 {
		t.Errorf("falling shape: %v, want a 25 (75%% used) and b 88 (12%%)", got)
	}
	if got := claimScores(t, e, step, step, pod, "a", "b"); got["a"] != 50 || got["b"] != 0 {
		t.Errorf("step shape: %v, want a 50 (75%%: half way from 50 to 100) and b 0", got)
	}
}

func TestClaimBinpackPacksOneGPUClaimPodsAndKeepsAWholeNode(t *testing.T) {
	e := newDRAEnv(t, []*v1.Node{draNode("a"), draNode("b")}, gpuSlice("a", 8, nil), gpuSlice("b", 8, nil), deviceClass(DRAGPUClass, ""))
	p := e.claimBinpack(ClaimBinpackArgs{})
	used := map[string]int{}
	var order []string
	for i := range 6 {
		pod := e.claimPod(fmt.Sprintf("one-%d", i), DRAGPUClass, 1, "")
		s := claimScores(t, e, p, p, pod, "b", "a")
		// The first pod finds both nodes empty (a tie); every later one must prefer the node in use.
		if i > 0 && s[order[0]] <= s[otherNode(order[0])] {
			t.Fatalf("pod %d: scores %v, want the node in use (%s) above the empty one", i, s, order[0])
		}
		n := top(s)
		e.allocate(pod, n, fmt.Sprintf("gpu-%d", used[n]))
		used[n]++
		order = append(order, n)
	}
	if len(used) != 1 {
		t.Fatalf("six 1-GPU claim pods went to %v, want one node", used)
	}
	whole := otherNode(order[0])
	p.refreshDRA()
	if free := p.draRoomOf(whole).free.GPUs[0]; free != 8*p.config.unit {
		t.Errorf("%s has %d GPU units free, want 8 whole GPUs", whole, free)
	}
}

func otherNode(n string) string {
	if n == "a" {
		return "b"
	}
	return "a"
}

func TestClaimBinpackCountsMIGDevicesByProfile(t *testing.T) {
	// mixed: 8 whole GPUs (6 held) and a MIG GPU of seven 1g.10gb devices, none held; mig: seven
	// 1g.10gb devices, 1 held. Counted over every GPU unit, mixed would be the fuller node; a
	// 1g.10gb pod fits only 1g.10gb devices, and those are fuller on mig.
	e := newDRAEnv(t, []*v1.Node{draNode("mixed"), draNode("mig")},
		gpuSlice("mixed", 8, map[string]int{"1g.10gb": 7}), gpuSlice("mig", 0, map[string]int{"1g.10gb": 7}),
		deviceClass(DRAGPUClass, ""), deviceClass(DRAMIGClass, ""))
	p := e.claimBinpack(ClaimBinpackArgs{})
	e.allocate(e.claimPod("six", DRAGPUClass, 6, ""), "mixed", "gpu-0", "gpu-1", "gpu-2", "gpu-3", "gpu-4", "gpu-5")
	oneG := `device.attributes["gpu.nvidia.com"].profile == "1g.10gb"`
	e.allocate(e.claimPod("slice", DRAMIGClass, 1, oneG), "mig", "mig-1g-10gb-0")
	got := claimScores(t, e, p, p, e.claimPod("small", DRAMIGClass, 1, oneG), "mixed", "mig")
	// 1 of 7 (14%) on mixed, 2 of 7 (28%) on mig.
	if got["mixed"] != 14 || got["mig"] != 28 {
		t.Errorf("1g.10gb pod scores %v, want mixed 14 and mig 28", got)
	}
	// A whole-GPU pod counts whole GPUs only: 7 of 8 on mixed; mig has none (left out: 0).
	if got := claimScores(t, e, p, p, e.claimPod("whole", DRAGPUClass, 1, ""), "mixed", "mig"); got["mixed"] != 87 || got["mig"] != 0 {
		t.Errorf("whole-GPU pod scores %v, want mixed 87 and mig 0", got)
	}
}

func TestClaimBinpackSkipsPodsWithoutGPUClaims(t *testing.T) {
	// Device-plugin pods and pods asking through an extended resource are NodeResourcesFit's.
	e := newDRAEnv(t, []*v1.Node{gpuNode("counted", 8, "128", "1024Gi"), draNode("dra")}, gpuSlice("dra", 8, nil), deviceClass(DRAGPUClass, ""))
	p := e.claimBinpack(ClaimBinpackArgs{})
	implicit := podOn("implicit", "", map[v1.ResourceName]string{
		v1.ResourceCPU: "4", v1.ResourceName(resourceapi.ResourceDeviceClassPrefix + DRAGPUClass): "1",
	})
	for _, pod := range []*v1.Pod{gpuPod("counted", "", 1, "4", "16Gi"), implicit, e.claimPod("nic", "nic.example.com", 1, "")} {
		if got := claimScores(t, e, p, p, pod, "counted", "dra"); got != nil {
			t.Errorf("pod %s scored %v, want PreScore to skip it", pod.Name, got)
		}
	}
	if _, s := p.SignPod(e.ctx, gpuPod("plain", "", 1, "4", "16Gi")); !s.IsSuccess() {
		t.Errorf("SignPod of a pod without claims: %v, want success (batching kept)", s)
	}
	if _, s := p.SignPod(e.ctx, e.claimPod("claimed", DRAGPUClass, 1, "")); s.Code() != fwk.Unschedulable {
		t.Errorf("SignPod of a claim pod: %v, want Unschedulable (not signable)", s)
	}
}

func TestClaimBinpackArgs(t *testing.T) {
	for _, tc := range []struct {
		shape []ShapePoint
		err   string
	}{
		{[]ShapePoint{{0, 0}, {101, 10}}, "GpuClaimBinpack args: shape[1].utilization is 101; expected 0 to 100"},
		{[]ShapePoint{{50, 0}, {50, 10}}, "GpuClaimBinpack args: shape[1].utilization is 50; expected more than shape[0].utilization, 50 (utilizations strictly increase)"},
		{[]ShapePoint{{0, 0}, {100, 11}}, "GpuClaimBinpack args: shape[1].score is 11; expected 0 to 10"},
		{[]ShapePoint{{0, -1}}, "GpuClaimBinpack args: shape[0].score is -1; expected 0 to 10"},
	} {
		raw, _ := json.Marshal(ClaimBinpackArgs{Shape: tc.shape})
		_, err := NewClaimBinpack(context.Background(), &runtime.Unknown{Raw: raw}, nil)
		if err == nil || err.Error() != tc.err {
			t.Errorf("shape %v: error %v, want %q", tc.shape, err, tc.err)
		}
	}
}

// The binpack profile in DRA mode weighs the DeviceClasses' extended resource names
// (deviceclass.resource.kubernetes.io/<class>) with the GPU weight, as
// components/binpack_scheduler renders them: kube-scheduler's own NodeResourcesFit then packs
// pods that ask through those names onto the fuller DRA node.
func TestRenderedProfilePacksExtendedResourceDRAPods(t *testing.T) {
	e := newDRAEnv(t, []*v1.Node{draNode("a"), draNode("b")}, gpuSlice("a", 8, nil), gpuSlice("b", 8, nil), deviceClass(DRAGPUClass, ""), deviceClass(DRAMIGClass, ""))
	name := v1.ResourceName(resourceapi.ResourceDeviceClassPrefix + DRAGPUClass)
	e.until("the DRA manager maps "+string(name), func() bool {
		return e.manager.DeviceClassResolver().GetDeviceClass(name) != nil
	})
	handle, err := frameworkruntime.NewFramework(e.ctx, nil, nil, e.opts...)
	if err != nil {
		t.Fatal(err)
	}
	args := &schedconfig.NodeResourcesFitArgs{ScoringStrategy: &schedconfig.ScoringStrategy{
		Type: schedconfig.RequestedToCapacityRatio,
		Resources: []schedconfig.ResourceSpec{
			{Name: "nvidia.com/gpu", Weight: 100}, {Name: "cpu", Weight: 1}, {Name: "memory", Weight: 1},
			{Name: string(name), Weight: 100}, {Name: resourceapi.ResourceDeviceClassPrefix + DRAMIGClass, Weight: 100},
		},
		RequestedToCapacityRatio: &schedconfig.RequestedToCapacityRatioParam{Shape: []schedconfig.UtilizationShapePoint{{Utilization: 0, Score: 0}, {Utilization: 100, Score: 10}}},
	}}
	pl, err := noderesources.NewFit(e.ctx, args, handle, feature.Features{EnableDRAExtendedResource: true})
	if err != nil {
		t.Fatal(err)
	}
	fit := pl.(fwk.ScorePlugin)
	e.allocate(e.claimPod("held", DRAGPUClass, 3, ""), "a", "gpu-0", "gpu-1", "gpu-2")
	// b runs the same cpu and memory without GPUs: only the GPUs tell the nodes apart.
	if err := e.cache.AddPod(e.logger, podOn("cpu-only", "b", map[v1.ResourceName]string{v1.ResourceCPU: "4", v1.ResourceMemory: "16Gi"})); err != nil {
		t.Fatal(err)
	}
	e.sync()
	pod := podOn("ext", "", map[v1.ResourceName]string{v1.ResourceCPU: "1", v1.ResourceMemory: "1Gi", name: "1"})
	pod.Spec.Containers[0].Resources.Limits = v1.ResourceList{name: resource.MustParse("1")}
	got := claimScores(t, e, fit, pl.(fwk.PreScorePlugin), pod, "a", "b")
	if got["a"] <= got["b"] {
		t.Errorf("NodeResourcesFit scores %v for a pod of 1 %s, want a (3 of 8 GPUs held) above b", got, name)
	}
	// Without the DRA names in the profile's resources the two nodes score alike: the GPUs are
	// not seen (what the profile would do with only the device plugin's names).
	args.ScoringStrategy.Resources = args.ScoringStrategy.Resources[:3]
	pl, err = noderesources.NewFit(e.ctx, args, handle, feature.Features{EnableDRAExtendedResource: true})
	if err != nil {
		t.Fatal(err)
	}
	if got := claimScores(t, e, pl.(fwk.ScorePlugin), pl.(fwk.PreScorePlugin), pod, "a", "b"); got["a"] != got["b"] {
		t.Errorf("without the DRA names NodeResourcesFit scores %v, want a tie", got)
	}
	// GpuClaimBinpack leaves the pod to NodeResourcesFit: it is not scored twice.
	p := e.claimBinpack(ClaimBinpackArgs{})
	if got := claimScores(t, e, p, p, pod, "a", "b"); got != nil {
		t.Errorf("GpuClaimBinpack scored an extended-resource pod: %v", got)
	}
}

func TestDRAFixtureDeviceNamesAreDNSLabels(t *testing.T) {
	// The API server refuses a ResourceSlice whose device names are not DNS labels; the fake
	// API server does not check, so the fixture must.
	for _, d := range gpuSlice("n", 2, map[string]int{"1g.10gb": 2, "3g.40gb": 1}).Spec.Devices {
		if errs := validation.IsDNS1123Label(d.Name); len(errs) > 0 {
			t.Errorf("device %q: %v", d.Name, errs)
		}
	}
}
