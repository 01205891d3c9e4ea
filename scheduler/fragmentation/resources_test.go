package fragmentation

import (
	"testing"

	v1 "k8s.io/api/core/v1"
	"k8s.io/kubernetes/pkg/scheduler/framework"
)

// GPU resources are counted for what they are: whole GPUs, replicas of a shared GPU (1/replicas
// each), MIG slices (the profile's slices of 7), each its own kind.
func TestPodAmountsByKind(t *testing.T) {
	c, err := ParseArgs(Args{SharedResources: []SharedResource{{Name: "nvidia.com/gpu.shared", Replicas: 4}}})
	if err != nil {
		t.Fatal(err)
	}
	p, err := newWithConfig(nil, c) // a GPU is lcm(7, 4) = 28 units
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name     string
		resource v1.ResourceName
		count    string
		units    int64 // 0: not a GPU resource
	}{
		{"whole GPUs", "nvidia.com/gpu", "2", 56},
		{"a shared replica is a quarter", "nvidia.com/gpu.shared", "1", 7},
		{"three shared replicas", "nvidia.com/gpu.shared", "3", 21},
		{"a 1g slice is a seventh", "nvidia.com/mig-1g.10gb", "1", 4},
		{"two 3g slices", "nvidia.com/mig-3g.40gb", "2", 24},
		{"a 7g slice is a whole GPU", "nvidia.com/mig-7g.80gb", "1", 28},
		{"a media-extension profile", "nvidia.com/mig-1g.10gb+me", "1", 4},
		{"a compute instance: its slices, not its GPU instance's", "nvidia.com/mig-1c.3g.20gb", "1", 4},
		{"not a MIG profile", "nvidia.com/mig-strategy", "1", 0},
		{"another extended resource", "example.com/fpga", "1", 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			pod := podOn("p", "", map[v1.ResourceName]string{v1.ResourceCPU: "1", tc.resource: tc.count})
			got := p.PodAmounts(pod)
			if got.GPUs != tc.units {
				t.Fatalf("PodAmounts = %+v, want %d GPU units", got, tc.units)
			}
			if tc.units == 0 {
				return
			}
			if name := p.res.table.Load().kinds[got.Kind].name; name != tc.resource {
				t.Errorf("kind %d is %s, want %s", got.Kind, name, tc.resource)
			}
		})
	}
}

// A node's room is counted per kind, with the same kinds as the pods'.
func TestNodeRoomByKind(t *testing.T) {
	p, err := newWithConfig(nil, mustParse(t, Args{MIGSlices: ptr(4)})) // A30: 4 slices
	if err != nil {
		t.Fatal(err)
	}
	n := framework.NewNodeInfo(podOn("used", "a30", map[v1.ResourceName]string{"nvidia.com/mig-2g.12gb": "1"}))
	n.SetNode(node("a30", map[v1.ResourceName]string{
		v1.ResourceCPU: "32", v1.ResourceMemory: "128Gi", "nvidia.com/gpu": "1",
		"nvidia.com/mig-1g.6gb": "4", "nvidia.com/mig-2g.12gb": "2",
	}))
	// PreScore reads every node (learning its MIG profiles) before Score asks for its room.
	alloc := p.res.room(n.GetAllocatable())
	free := p.Free(n)
	one := p.PodAmounts(podOn("one", "", map[v1.ResourceName]string{"nvidia.com/mig-1g.6gb": "1"}))
	two := p.PodAmounts(podOn("two", "", map[v1.ResourceName]string{"nvidia.com/mig-2g.12gb": "1"}))
	whole := p.PodAmounts(gpuPod("whole", "", 1, "1", "1Gi"))
	if alloc.TotalGPUs() != 12 {
		t.Errorf("allocatable %v; want 12 units: a GPU, four 1g and two 2g slices of 4", alloc.GPUs)
	}
	if free.GPUs[one.Kind] != 4*one.GPUs || free.GPUs[two.Kind] != two.GPUs || free.GPUs[whole.Kind] != whole.GPUs {
		t.Errorf("free %v; want four 1g slices, one 2g slice, one whole GPU (%+v, %+v, %+v)", free.GPUs, one, two, whole)
	}
	if one.GPUs != 1 || two.GPUs != 2 || whole.GPUs != 4 || free.TotalGPUs() != 10 {
		t.Errorf("units 1g %d, 2g %d, GPU %d, node %d; want 1, 2, 4 and 10 of a GPU's 4", one.GPUs, two.GPUs, whole.GPUs, free.TotalGPUs())
	}
}

func mustParse(t *testing.T, args Args) config {
	t.Helper()
	c, err := ParseArgs(args)
	if err != nil {
		t.Fatal(err)
	}
	return c
}
