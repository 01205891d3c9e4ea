package fragmentation

import (
	"reflect"
	"testing"
)

const gib = int64(1) << 30

func amounts(gpus, cores, memGiB int64) Amounts {
	return Amounts{GPUs: gpus, MilliCPU: cores * 1000, Memory: memGiB * gib}
}

func TestFits(t *testing.T) {
	for _, tc := range []struct {
		name  string
		class Amounts
		free  Amounts
		want  int64
	}{
		{"by GPUs", amounts(2, 1, 1), amounts(7, 100, 100), 3},
		{"by cpu", amounts(1, 16, 1), amounts(8, 40, 100), 2},
		{"by memory", amounts(1, 1, 64), amounts(8, 100, 200), 3},
		{"too few GPUs", amounts(8, 1, 1), amounts(7, 100, 100), 0},
		{"cpu overcommitted", amounts(1, 1, 1), Amounts{GPUs: 4, MilliCPU: -500, Memory: gib}, 0},
		{"no cpu asked: not limited by cpu", Amounts{GPUs: 1, Memory: gib}, amounts(3, 0, 10), 3},
		{"CPU-only shape fits nothing", amounts(0, 1, 1), amounts(8, 100, 100), 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := (Class{Shape: tc.class}).Fits(tc.free); got != tc.want {
				t.Errorf("Fits(%+v) = %d, want %d", tc.free, got, tc.want)
			}
		})
	}
}

func TestStranded(t *testing.T) {
	for _, tc := range []struct {
		name  string
		class Amounts
		free  Amounts
		want  int64
	}{
		{"scattered below the class", amounts(4, 1, 1), amounts(7, 100, 100), 3},
		{"cpu gone", amounts(1, 16, 1), amounts(4, 20, 100), 3},
		{"none left over", amounts(2, 8, 8), amounts(4, 16, 16), 0},
		{"no free GPUs", amounts(1, 1, 1), amounts(0, 100, 100), 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := (Class{Shape: tc.class}).Stranded(tc.free); got != tc.want {
				t.Errorf("Stranded(%+v) = %d, want %d", tc.free, got, tc.want)
			}
		})
	}
}

// best is the index of the cheapest node for pod under classes, on nodes with the given free
// amounts and GPU counts.
func best(t *testing.T, classes []Class, free []Amounts, gpus []int64, pod Amounts) int {
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
	for _, tc := range []struct {
		name    string
		classes []Class
		free    []Amounts
		gpus    []int64
		pod     Amounts
		want    int
		because string
	}{
		{
			name:    "a 1-GPU pod keeps the only whole 8-GPU node whole",
			classes: []Class{whole8, one},
			free:    []Amounts{amounts(8, 128, 768), amounts(5, 90, 500)},
			gpus:    []int64{8, 8},
			pod:     amounts(1, 12, 32),
			want:    1,
			because: "node 0 is the only room left for the 8-GPU shape",
		},
		{
			name:    "a CPU-only pod goes where no GPU is free",
			classes: []Class{one},
			free:    []Amounts{amounts(2, 24, 64), amounts(0, 24, 64)},
			gpus:    []int64{2, 2},
			pod:     amounts(0, 12, 32),
			want:    1,
			because: "on node 0 it would take the cpu a free GPU needs",
		},
		{
			name:    "a GPU pod does not strand the node's last GPU",
			classes: []Class{one},
			free:    []Amounts{amounts(2, 24, 64), amounts(2, 40, 64)},
			gpus:    []int64{2, 2},
			pod:     amounts(1, 20, 32),
			want:    1,
			because: "on node 0 the other GPU would be left with 4 cores, less than the 1-GPU shape's 12",
		},
		{
			name:    "a 2-GPU pod fills a 2-GPU hole, not a 4-GPU one",
			classes: []Class{{Shape: amounts(4, 8, 8), Weight: 0.3}, {Shape: amounts(2, 4, 4), Weight: 0.7}},
			free:    []Amounts{amounts(4, 64, 64), amounts(2, 64, 64)},
			gpus:    []int64{8, 8},
			pod:     amounts(2, 4, 4),
			want:    1,
			because: "the 4-GPU hole is the room the 4-GPU shape needs",
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
	node := amounts(1, 10, 10)
	plenty := NewModel([]Class{class}, []Amounts{node, node, node, node}, []int64{1, 1, 1, 1})
	scarce := NewModel([]Class{class}, []Amounts{node, amounts(0, 10, 10)}, []int64{1, 1})
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
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := Normalize(tc.costs, 100); !reflect.DeepEqual(got, tc.want) {
				t.Errorf("Normalize(%v) = %v, want %v", tc.costs, got, tc.want)
			}
		})
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
