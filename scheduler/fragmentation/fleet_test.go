package fragmentation

import (
	"fmt"
	"math/rand/v2"
	"reflect"
	"testing"
)

const mib = int64(1) << 20

func TestWholeNode(t *testing.T) {
	wholeKind0 := [MaxKinds]bool{true}
	mixed := roomOf(1, 4, 64, 512) // kind 1: four shared GPUs' replicas
	mixed.GPUs[0] = 2
	for _, tc := range []struct {
		name string
		room Room // allocatable less what system pods request
		want Amounts
	}{
		{"a whole node", room(8, 128, 768), amounts(8, 128, 768)},
		{
			"cpu and memory rounded down to the grid",
			Room{GPUs: [MaxKinds]int64{8}, MilliCPU: 127_950, Memory: 767*gib + 900*mib},
			amounts(8, 127, 767),
		},
		{"no GPUs, no shape", room(0, 64, 256), Amounts{}},
		{"shared or MIG GPUs are not taken a node at a time", roomOf(1, 7, 64, 256), Amounts{}},
		{"the whole-GPU kind of a node with others", mixed, amounts(2, 64, 512)},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := WholeNode(tc.room, &wholeKind0); got != tc.want {
				t.Errorf("WholeNode(%+v) = %+v, want %+v", tc.room, got, tc.want)
			}
		})
	}
}

func TestPriorShapes(t *testing.T) {
	// uneven: one machine model whose kubelets report memory a few MiB apart, floored to GiB on
	// both sides of a GiB boundary.
	uneven := map[Amounts]int{amounts(8, 127, 767): 300, amounts(8, 127, 766): 200}
	many := map[Amounts]int{}
	for i := range 40 {
		many[amounts(8, int64(64+2*i), 512)] = 1 + i%7
	}
	for _, tc := range []struct {
		name      string
		wholes    map[Amounts]int
		maxPriors int
		want      []Amounts
	}{
		{"one per machine model", map[Amounts]int{amounts(8, 127, 767): 10, amounts(4, 63, 383): 5}, 16,
			[]Amounts{amounts(4, 63, 383), amounts(8, 127, 767)}},
		{"a grid step apart: merged into the smaller", uneven, 16, []Amounts{amounts(8, 127, 766)}},
		{"a core and a GiB apart: merged", map[Amounts]int{amounts(8, 96, 384): 1, amounts(8, 97, 385): 1}, 16,
			[]Amounts{amounts(8, 96, 384)}},
		{"two GiB apart: two classes", map[Amounts]int{amounts(8, 96, 384): 1, amounts(8, 96, 386): 1}, 16,
			[]Amounts{amounts(8, 96, 384), amounts(8, 96, 386)}},
		{"other GPUs: not merged", map[Amounts]int{amounts(8, 96, 384): 1, amounts(4, 96, 384): 1}, 16,
			[]Amounts{amounts(4, 96, 384), amounts(8, 96, 384)}},
		{"capped, the models of most nodes kept", map[Amounts]int{
			amounts(8, 96, 384): 1, amounts(8, 128, 768): 9, amounts(2, 32, 128): 5,
		}, 2, []Amounts{amounts(2, 32, 128), amounts(8, 128, 768)}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := PriorShapes(tc.wholes, tc.maxPriors); !reflect.DeepEqual(got, tc.want) {
				t.Errorf("PriorShapes = %+v, want %+v", got, tc.want)
			}
		})
	}
	if got := PriorShapes(many, 16); len(got) != 16 {
		t.Errorf("40 machine models, cap 16: %d classes", len(got))
	}
}

// The fleet's supplies, kept node by node, must be what a recount over every node gives,
// whatever order nodes come, change and go in, and whichever shapes are asked for.
func TestFleetSupplyMatchesRecount(t *testing.T) {
	rng := rand.New(rand.NewPCG(3, 4))
	shapes := []Amounts{amounts(1, 8, 32), amounts(2, 16, 64), amounts(4, 4, 4), amounts(8, 96, 256),
		{Kind: 1, GPUs: 1, MilliCPU: 2000, Memory: 8 * gib}, {Kind: 1, GPUs: 3, MilliCPU: 2000}}
	f := NewFleet(16, 4) // fewer tracked shapes than asked for: evictions too
	nodes := map[string]Room{}
	for step := range 3000 {
		name := fmt.Sprintf("n%d", rng.IntN(60))
		switch rng.IntN(10) {
		case 0:
			f.Remove(name)
			delete(nodes, name)
		default:
			r := roomOf(Kind(rng.IntN(2)), int64(rng.IntN(9)), int64(rng.IntN(130)), int64(rng.IntN(800)))
			r.MilliCPU -= int64(rng.IntN(2)) * 500 // now and then overcommitted or off the grid
			f.Set(name, int64(step), r, WholeNode(r, &[MaxKinds]bool{true}), r.TotalGPUs())
			nodes[name] = r
		}
		if step%7 != 0 {
			continue
		}
		classes := []Class{{Shape: shapes[rng.IntN(len(shapes))]}, {Shape: shapes[rng.IntN(len(shapes))]}}
		for _, p := range f.Priors() {
			classes = append(classes, Class{Shape: p})
		}
		got := f.Model(classes)
		var free []Room
		var gpus []int64
		wholes := map[Amounts]int{}
		for _, r := range nodes {
			free = append(free, r)
			gpus = append(gpus, r.TotalGPUs())
			if w := WholeNode(r, &[MaxKinds]bool{true}); w.GPUs > 0 {
				wholes[w]++
			}
		}
		want := NewModel(classes, free, gpus)
		if !reflect.DeepEqual(got.Supply, want.Supply) || got.MaxGPUs != want.MaxGPUs {
			t.Fatalf("step %d: supply %v max %d; a recount gives %v max %d", step, got.Supply, got.MaxGPUs, want.Supply, want.MaxGPUs)
		}
		if p := PriorShapes(wholes, 16); !reflect.DeepEqual(f.Priors(), p) {
			t.Fatalf("step %d: priors %v; from every node %v", step, f.Priors(), p)
		}
	}
}
