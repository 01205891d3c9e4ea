package fragmentation

import (
	"math/rand/v2"
	"slices"
	"testing"

	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
)

// greedyFollowers is Followers worked out node by node the plain way: the member on node n,
// then each of the rest on the node whose next pod costs least (n on a tie, then the first
// node), followPenalty for one no node takes.
func greedyFollowers(m *Model, pod Amounts, rest int, frees []Room) []float64 {
	shape := Class{Shape: pod}
	out := make([]float64, len(frees))
	for n := range frees {
		if shape.Fits(&frees[n]) == 0 {
			continue
		}
		rooms := slices.Clone(frees)
		rooms[n] = rooms[n].Take(pod)
		order := []int{n} // n first: its own pod wins a tie
		for i := range frees {
			if i != n {
				order = append(order, i)
			}
		}
		for range rest {
			best, bestCost := -1, 0.0
			for _, i := range order {
				if shape.Fits(&rooms[i]) == 0 {
					continue
				}
				if c := m.Cost(rooms[i], pod); best < 0 || c < bestCost {
					best, bestCost = i, c
				}
			}
			if best < 0 {
				out[n] += followPenalty
				continue
			}
			out[n] += bestCost
			rooms[best] = rooms[best].Take(pod)
		}
	}
	return out
}

// Followers shares the work between nodes of one room and between the nodes the run's head
// does not reach; the costs are those of the plain greedy placement, to the bit, on fleets
// with many equal rooms, gangs larger and smaller than what fits, and costs of every sign.
func TestFollowersMatchGreedyPlacement(t *testing.T) {
	rng := rand.New(rand.NewPCG(7, 11))
	for trial := range 300 {
		var classes []Class
		for range 1 + rng.IntN(6) {
			classes = append(classes, Class{
				Shape:  Amounts{Kind: Kind(rng.IntN(2)), GPUs: int64(1 + rng.IntN(8)), MilliCPU: int64(rng.IntN(4)) * 16000, Memory: int64(rng.IntN(4)) << 36},
				Weight: rng.Float64(),
			})
		}
		nodes := 1 + rng.IntN(30)
		rooms := make([]Room, 1+rng.IntN(nodes)) // the fleet's distinct rooms
		for i := range rooms {
			rooms[i].GPUs[0] = int64(rng.IntN(9))
			rooms[i].GPUs[1] = int64(rng.IntN(3))
			rooms[i].MilliCPU = int64(rng.IntN(130)) * 1000
			rooms[i].Memory = int64(rng.IntN(800)) << 30
		}
		frees, gpus := make([]Room, nodes), make([]int64, nodes)
		for i := range frees {
			frees[i], gpus[i] = rooms[rng.IntN(len(rooms))], 8
		}
		m := NewModel(classes, frees, gpus)
		pod := Amounts{Kind: Kind(rng.IntN(2)), GPUs: int64(1 + rng.IntN(4)), MilliCPU: int64(rng.IntN(5)) * 8000, Memory: int64(rng.IntN(5)) << 34}
		rest := rng.IntN(40)
		if got, want := m.Followers(pod, rest, frees), greedyFollowers(m, pod, rest, frees); !slices.Equal(got, want) {
			t.Fatalf("trial %d (pod %+v, %d more, %d nodes of %d rooms): Followers %v, greedy placement %v", trial, pod, rest, nodes, len(rooms), got, want)
		}
	}
}

// A member's requests are worked out once per pod object: the same object reuses them, a new
// object of the same pod (its requests changed) is worked out again.
func TestMemberRequestsFollowThePodObject(t *testing.T) {
	var r memberRequests
	pod := gpuPod("worker-0", "", 2, "16", "64Gi")
	pod.UID = "worker-0"
	if got := cpuOf(r.of(pod)); got != 16000 {
		t.Fatalf("cpu of the first object: %d millicores, want 16000", got)
	}
	updated := pod.DeepCopy()
	updated.Spec.Containers[0].Resources.Requests[v1.ResourceCPU] = resource.MustParse("32")
	if got := cpuOf(r.of(updated)); got != 32000 {
		t.Errorf("cpu of the new object of the same pod: %d millicores, want 32000", got)
	}
	if got := cpuOf(r.of(pod)); got != 16000 {
		t.Errorf("cpu of the first object again: %d millicores, want 16000", got)
	}
}

func cpuOf(req v1.ResourceList) int64 { return req.Cpu().MilliValue() }
