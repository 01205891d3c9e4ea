package fragmentation

import (
	"math/rand/v2"
	"reflect"
	"slices"
	"testing"
)

const gib = int64(1) << 30

func amounts(gpus, cores, memGiB int64) Amounts {
	return Amounts{GPUs: gpus, MilliCPU: cores * 1000, Memory: memGiB * gib}
}

// room is free room with GPUs of kind 0 only.
func room(gpus, cores, memGiB int64) Room {
	return roomOf(0, gpus, cores, memGiB)
}

func roomOf(kind Kind, gpus, cores, memGiB int64) Room {
	r := Room{MilliCPU: cores * 1000, Memory: memGiB * gib}
	r.GPUs[kind] = gpus
	return r
}

func TestFits(t *testing.T) {
	overcommitted := room(4, 0, 1)
	overcommitted.MilliCPU = -500
	mixed := roomOf(1, 7, 100, 100)
	mixed.GPUs[0] = 2
	for _, tc := range []struct {
		name  string
		class Amounts
		free  Room
		want  int64
	}{
		{"by GPUs", amounts(2, 1, 1), room(7, 100, 100), 3},
		{"by cpu", amounts(1, 16, 1), room(8, 40, 100), 2},
		{"by memory", amounts(1, 1, 64), room(8, 100, 200), 3},
		{"too few GPUs", amounts(8, 1, 1), room(7, 100, 100), 0},
		{"cpu overcommitted", amounts(1, 1, 1), overcommitted, 0},
		{"no cpu asked: not limited by cpu", Amounts{GPUs: 1, Memory: gib}, room(3, 0, 10), 3},
		{"CPU-only shape fits nothing", amounts(0, 1, 1), room(8, 100, 100), 0},
		{"another kind's GPUs do not fit", Amounts{Kind: 1, GPUs: 1, MilliCPU: 1000}, room(8, 100, 100), 0},
		{"only its own kind's GPUs count", Amounts{Kind: 1, GPUs: 3, MilliCPU: 1000}, mixed, 2},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := (Class{Shape: tc.class}).Fits(&tc.free); got != tc.want {
				t.Errorf("Fits(%+v) = %d, want %d", tc.free, got, tc.want)
			}
		})
	}
}

func TestStranded(t *testing.T) {
	mig := roomOf(1, 7, 100, 100)
	for _, tc := range []struct {
		name  string
		class Amounts
		free  Room
		want  int64
	}{
		{"scattered below the class", amounts(4, 1, 1), room(7, 100, 100), 3},
		{"cpu gone", amounts(1, 16, 1), room(4, 20, 100), 3},
		{"none left over", amounts(2, 8, 8), room(4, 16, 16), 0},
		{"no free GPUs", amounts(1, 1, 1), room(0, 100, 100), 0},
		{"GPUs of another kind", amounts(1, 1, 1), mig, 7},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := (Class{Shape: tc.class}).Stranded(&tc.free); got != tc.want {
				t.Errorf("Stranded(%+v) = %d, want %d", tc.free, got, tc.want)
			}
		})
	}
}

// best is the index of the cheapest node for pod under classes, on nodes with the given free
// room and GPU counts.
func best(t *testing.T, classes []Class, free []Room, gpus []int64, pod Amounts) int {
	t.Helper()
	m := NewModel(classes, free, gpus)
	costs := make([]float64, len(free))
	for i := range free {
		costs[i] = m.Cost(free[i], pod)
	}
	scores := Normalize(costs, 100)
	winner := -1
	for i, s := range scores {
		if s == 100 {
			if winner >= 0 {
				t.Fatalf("nodes %d and %d tie; costs %v", winner, i, costs)
			}
			winner = i
		}
	}
	return winner
}

func TestCostPlacement(t *testing.T) {
	whole8 := Class{Shape: amounts(8, 120, 300), Weight: 0.02}
	one := Class{Shape: amounts(1, 12, 32), Weight: 0.98}
	slice := Class{Shape: Amounts{Kind: 1, GPUs: 1, MilliCPU: 4000, Memory: 16 * gib}, Weight: 1}
	for _, tc := range []struct {
		name    string
		classes []Class
		free    []Room
		gpus    []int64
		pod     Amounts
		want    int
		because string
	}{
		{
			name:    "a 1-GPU pod keeps the only whole 8-GPU node whole",
			classes: []Class{whole8, one},
			free:    []Room{room(8, 128, 768), room(5, 90, 500)},
			gpus:    []int64{8, 8},
			pod:     amounts(1, 12, 32),
			want:    1,
			because: "node 0 is the only room left for the 8-GPU shape",
		},
		{
			name:    "a CPU-only pod goes where no GPU is free",
			classes: []Class{one},
			free:    []Room{room(2, 24, 64), room(0, 24, 64)},
			gpus:    []int64{2, 2},
			pod:     amounts(0, 12, 32),
			want:    1,
			because: "on node 0 it would take the cpu a free GPU needs",
		},
		{
			name:    "a GPU pod does not strand the node's last GPU",
			classes: []Class{one},
			free:    []Room{room(2, 24, 64), room(2, 40, 64)},
			gpus:    []int64{2, 2},
			pod:     amounts(1, 20, 32),
			want:    1,
			because: "on node 0 the other GPU would be left with 4 cores, less than the 1-GPU shape's 12",
		},
		{
			name:    "a 2-GPU pod fills a 2-GPU hole, not a 4-GPU one",
			classes: []Class{{Shape: amounts(4, 8, 8), Weight: 0.3}, {Shape: amounts(2, 4, 4), Weight: 0.7}},
			free:    []Room{room(4, 64, 64), room(2, 64, 64)},
			gpus:    []int64{8, 8},
			pod:     amounts(2, 4, 4),
			want:    1,
			because: "the 4-GPU hole is the room the 4-GPU shape needs",
		},
		{
			name:    "a CPU-only pod takes the cpu of whole GPUs, not of the only MIG slices",
			classes: []Class{slice, {Shape: amounts(1, 4, 16), Weight: 1}},
			free:    []Room{roomOf(1, 1, 4, 64), room(4, 20, 64)},
			gpus:    []int64{7, 28},
			pod:     amounts(0, 4, 16),
			want:    1,
			because: "node 0 is the only room for the slice shape; node 1 still fits four 1-GPU pods after it",
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := best(t, tc.classes, tc.free, tc.gpus, tc.pod); got != tc.want {
				t.Errorf("best node %d, want %d: %s", got, tc.want, tc.because)
			}
		})
	}
}

func TestCostScarceRoomCostsMore(t *testing.T) {
	// The same placement uses up one slot of each class; the class with less room left in the
	// cluster makes it dearer.
	class := Class{Shape: amounts(1, 1, 1), Weight: 1}
	node := room(1, 10, 10)
	plenty := NewModel([]Class{class}, []Room{node, node, node, node}, []int64{1, 1, 1, 1})
	scarce := NewModel([]Class{class}, []Room{node, room(0, 10, 10)}, []int64{1, 1})
	if p, s := plenty.Cost(node, amounts(1, 1, 1)), scarce.Cost(node, amounts(1, 1, 1)); p >= s {
		t.Errorf("cost with 4 slots left %v, with 1 slot left %v; want the first lower", p, s)
	}
	if got := scarce.Supply; !reflect.DeepEqual(got, []int64{1}) {
		t.Errorf("supply %v, want [1]", got)
	}
}

func TestNormalize(t *testing.T) {
	for _, tc := range []struct {
		name  string
		costs []float64
		want  []int64
	}{
		{"lowest cost best", []float64{0.5, 0, 1}, []int64{50, 100, 0}},
		{"all equal", []float64{0.2, 0.2}, []int64{100, 100}},
		{"near the best is not the best", []float64{0, 0.001, 1}, []int64{100, 99, 0}},
		{"none", nil, []int64{}},
		{"the best scores the maximum however the division rounds", []float64{0.171363333333, 0}, []int64{0, 100}},
		{
			"costs from the 0.9 percentile up all score 0",
			[]float64{0, 0.25, 0.5, 0.75, 1, 1.25, 1.5, 1.75, 2, 2.25, 2.5, 100},
			[]int64{100, 90, 80, 70, 60, 50, 40, 30, 20, 10, 0, 0},
		},
		{
			"most nodes at the best: the dearest sets the scale",
			[]float64{0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1},
			[]int64{100, 100, 100, 100, 100, 100, 100, 100, 100, 100, 0},
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := Normalize(tc.costs, 100); !reflect.DeepEqual(got, tc.want) {
				t.Errorf("Normalize(%v) = %v, want %v", tc.costs, got, tc.want)
			}
		})
	}
}

// One node far dearer than the rest must not squeeze them into the few points next to the
// best, where other score plugins (weight 1 to 3 each) outvote the differences.
func TestNormalizeOutlier(t *testing.T) {
	for _, outlier := range []float64{2, 1e3, 1e9} {
		costs := make([]float64, 0, 21)
		for i := range 20 {
			costs = append(costs, float64(i)/20) // 0 .. 0.95
		}
		costs = append(costs, outlier)
		scores := Normalize(costs, 100)
		if median := scores[10]; median < 35 || median > 65 {
			t.Errorf("outlier %v: the median node scores %d, want 35..65; scores %v", outlier, median, scores)
		}
		for i := 1; i < 18; i++ {
			if scores[i] >= scores[i-1] {
				t.Errorf("outlier %v: node %d scores %d, not below node %d's %d; scores %v", outlier, i, scores[i], i-1, scores[i-1], scores)
			}
		}
		if scores[20] != 0 {
			t.Errorf("outlier %v scores %d, want 0", outlier, scores[20])
		}
	}
}

func TestLearnerClasses(t *testing.T) {
	l := NewLearner(1000)
	l.Observe(Amounts{GPUs: 1, MilliCPU: 6228, Memory: 10*gib + 1})
	l.Observe(Amounts{GPUs: 1, MilliCPU: 6500, Memory: 11 * gib})
	l.Observe(amounts(8, 96, 256))
	l.Observe(amounts(0, 12, 64)) // CPU-only: not a GPU class
	node8 := amounts(8, 128, 768)
	got := l.Classes(64, []Amounts{node8, amounts(0, 64, 256), node8}, 0.003)
	want := []Class{
		{Shape: amounts(1, 7, 11), Weight: 2.0 / 3},
		{Shape: amounts(8, 96, 256), Weight: 1.0 / 3},
		{Shape: node8, Weight: 0.003},
	}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("Classes = %+v\nwant %+v", got, want)
	}
	if got := l.Classes(1, nil, 0); len(got) != 1 || got[0].Weight != 1 {
		t.Errorf("the most frequent class alone = %+v, want weight 1", got)
	}
	if got := NewLearner(10).Classes(64, []Amounts{node8}, 0); len(got) != 0 {
		t.Errorf("no pods seen, no priors: %+v, want none", got)
	}
}

func TestLearnerForgets(t *testing.T) {
	l := NewLearner(4)
	for range 3 {
		l.Observe(amounts(1, 1, 1))
	}
	l.Observe(amounts(2, 1, 1)) // the 4th pod halves the counts: 1.5 and 0.5
	for range 4 {
		l.Observe(amounts(4, 1, 1))
	}
	// The 6th pod reaches the window again: 0.75 (kept), 0.25 (dropped), 1; then 4-GPU pods 7
	// and 8 make it 3.
	got := l.Classes(64, nil, 0)
	if len(got) != 2 || got[0].Shape != amounts(4, 1, 1) || got[1].Shape != amounts(1, 1, 1) {
		t.Fatalf("Classes after forgetting = %+v; want the 4-GPU shape first, the 2-GPU one gone", got)
	}
	if w := got[0].Weight; w != 0.8 {
		t.Errorf("4-GPU weight %v, want 3/3.75", w)
	}
}

// The learner keeps its shapes in order as it counts them; the classes must be those a full
// sort of the counts gives (most frequent first, then by shape).
func TestLearnerOrderIsASort(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	l := NewLearner(500)
	counts := map[Amounts]float64{}
	var total float64
	for range 5000 {
		pod := amounts(int64(1+rng.IntN(4)), int64(1+rng.IntN(6)), int64(1+rng.IntN(5)))
		l.Observe(pod)
		counts[pod]++
		if total++; total >= 500 {
			total = 0
			for s, n := range counts {
				if n /= 2; n < 0.5 {
					delete(counts, s)
					continue
				}
				counts[s] = n
				total += n
			}
		}
	}
	want := make([]counted, 0, len(counts))
	for s, n := range counts {
		want = append(want, counted{s, n})
	}
	slices.SortFunc(want, func(a, b counted) int {
		if before(a, b) {
			return -1
		}
		return 1
	})
	got := l.Classes(len(want)+1, nil, 0)
	if len(got) != len(want) {
		t.Fatalf("%d classes, want %d", len(got), len(want))
	}
	for i := range want {
		if got[i].Shape != want[i].shape {
			t.Fatalf("class %d is %+v, want %+v (count %v)", i, got[i].Shape, want[i].shape, want[i].n)
		}
	}
}

func TestLearnerBoundsItsShapes(t *testing.T) {
	l := NewLearner(1 << 30)
	l.Observe(amounts(8, 1, 1))
	l.Observe(amounts(8, 1, 1))
	for i := range 3 * MaxLearnedShapes {
		l.Observe(amounts(1, 1, int64(i+1)))
	}
	if n := len(l.order); n != MaxLearnedShapes {
		t.Errorf("%d shapes counted, want at most %d", n, MaxLearnedShapes)
	}
	if got := l.Classes(1, nil, 0); got[0].Shape != amounts(8, 1, 1) {
		t.Errorf("most frequent class %+v; the frequent shape must outlive the stream of new ones", got[0])
	}
}
