package fragmentation

import (
	"math"
	"slices"
)

// MaxKinds is how many GPU resources (whole, shared and MIG profiles together) the model
// tells apart.
const MaxKinds = 16

// Kind is one GPU resource (nvidia.com/gpu, nvidia.com/gpu.shared, nvidia.com/mig-1g.10gb, ...):
// a pod asking for one kind fits only in free GPUs of that kind.
type Kind uint8

// Amounts are what a pod requests, and a class's shape: GPUs of one kind in GPU units (a whole
// GPU is the plugin's unit count, so a MIG slice or a shared replica is a fraction of it),
// milli-cpu and memory bytes.
type Amounts struct {
	Kind     Kind
	GPUs     int64
	MilliCPU int64
	Memory   int64
}

// Room is what a node has free (or allocatable): GPU units per kind, milli-cpu and memory bytes.
type Room struct {
	GPUs     [MaxKinds]int64
	MilliCPU int64
	Memory   int64
}

// Take returns the room left once a is placed in r.
func (r Room) Take(a Amounts) Room {
	r.GPUs[a.Kind] -= a.GPUs
	r.MilliCPU -= a.MilliCPU
	r.Memory -= a.Memory
	return r
}

// Add returns r + o, kind by kind.
func (r Room) Add(o Room) Room {
	for k := range r.GPUs {
		r.GPUs[k] += o.GPUs[k]
	}
	r.MilliCPU += o.MilliCPU
	r.Memory += o.Memory
	return r
}

// Sub returns r - o, kind by kind.
func (r Room) Sub(o Room) Room {
	for k := range r.GPUs {
		r.GPUs[k] -= o.GPUs[k]
	}
	r.MilliCPU -= o.MilliCPU
	r.Memory -= o.Memory
	return r
}

// TotalGPUs is the room's GPU units over every kind (what is overcommitted counts as none).
func (r *Room) TotalGPUs() int64 {
	var n int64
	for _, g := range r.GPUs {
		n += max(g, 0)
	}
	return n
}

// Class is one pod shape of the workload model with its share of the arrivals.
type Class struct {
	Shape  Amounts
	Weight float64
}

// Fits is how many pods of the class fit in free: as many as the GPUs of the class's kind, the
// cpu and the memory allow together. A class that asks for no cpu (or memory) is not limited
// by it.
func (c Class) Fits(free *Room) int64 {
	g := free.GPUs[c.Shape.Kind]
	if c.Shape.GPUs <= 0 || g < c.Shape.GPUs {
		return 0
	}
	n := g / c.Shape.GPUs
	if c.Shape.MilliCPU > 0 {
		n = min(n, max(free.MilliCPU, 0)/c.Shape.MilliCPU)
	}
	if c.Shape.Memory > 0 {
		n = min(n, max(free.Memory, 0)/c.Shape.Memory)
	}
	return n
}

// Stranded is how many of free's GPU units are left over once as many pods of the class as
// fit are placed: GPUs scattered below the class's count, GPUs whose cpu or memory is gone and
// GPUs of another kind count alike (FGD's fragmentation, for the node's other resources too).
func (c Class) Stranded(free *Room) int64 {
	return c.stranded(free, free.TotalGPUs())
}

func (c Class) stranded(free *Room, total int64) int64 {
	return strandedBy(total, c.Fits(free), c.Shape.GPUs)
}

// strandedBy: of total free GPU units, those left once fits pods of gpus units each are placed.
func strandedBy(total, fits, gpus int64) int64 {
	if total <= 0 {
		return 0
	}
	return total - fits*gpus
}

// Model is the workload the score protects: the classes and, per class, how many pods of
// it the whole cluster can still take (its supply).
type Model struct {
	Classes []Class
	Supply  []int64
	// MaxGPUs is the most GPU units any node has; it scales the fragmentation term.
	MaxGPUs int64
}

// NewModel computes each class's supply over the free room of every node, from scratch. The
// plugin keeps the same sums up to date node by node (Fleet); this is their reference.
func NewModel(classes []Class, nodesFree []Room, nodesGPUs []int64) *Model {
	m := &Model{Classes: classes, Supply: make([]int64, len(classes))}
	for i := range nodesFree {
		for c, class := range classes {
			m.Supply[c] += class.Fits(&nodesFree[i])
		}
		m.MaxGPUs = max(m.MaxGPUs, nodesGPUs[i])
	}
	return m
}

// TieBreak weighs the fragmentation term against the loss of scarce room: it only orders
// placements that use up the same share of every class's room.
const TieBreak = 0.01

// Cost of placing pod on a node with free room; lower is better. The main term is the
// share of each class's remaining room in the cluster that the placement uses up, weighted by
// the class's share of the arrivals: room for a shape few nodes can still take (a whole
// 8-GPU node with its cpu) costs more than room for a shape most nodes offer. The second
// term is the GPUs the placement leaves stranded for the classes (FGD's fragmentation delta).
func (m *Model) Cost(free Room, pod Amounts) float64 {
	after := free.Take(pod)
	total, totalAfter := free.TotalGPUs(), after.TotalGPUs()
	var lost, stranded float64
	for c, class := range m.Classes {
		before, left := class.Fits(&free), class.Fits(&after)
		if before != left {
			lost += class.Weight * float64(before-left) / float64(max(m.Supply[c], 1))
		}
		stranded += class.Weight * float64(strandedBy(totalAfter, left, class.Shape.GPUs)-strandedBy(total, before, class.Shape.GPUs))
	}
	return lost + TieBreak*stranded/float64(max(m.MaxGPUs, 1))
}

// ClampPercentile is where Normalize stops stretching: nodes at or above this percentile of
// the scored nodes' costs all score 0, so that a few very dear nodes do not squeeze every
// other node into the few points next to the best, where other score plugins outvote it.
const ClampPercentile = 0.9

// Normalize maps costs to scores from maxScore (the lowest cost) down to 0 (the cost at
// ClampPercentile, nearest rank, and above), linearly in between; when that percentile is
// the lowest cost itself, the highest cost is used instead. With all costs equal every node
// scores maxScore.
func Normalize(costs []float64, maxScore int64) []int64 {
	scores := make([]int64, len(costs))
	if len(costs) == 0 {
		return scores
	}
	sorted := slices.Clone(costs)
	slices.Sort(sorted)
	lo := sorted[0]
	hi := sorted[int(math.Ceil(ClampPercentile*float64(len(sorted))))-1]
	if hi <= lo {
		hi = sorted[len(sorted)-1]
	}
	for i, c := range costs {
		switch {
		case c <= lo: // exactly: the best nodes must not lose a point to rounding
			scores[i] = maxScore
		case c >= hi:
			scores[i] = 0
		default:
			scores[i] = min(int64(math.Floor(float64(maxScore)*((hi-c)/(hi-lo)))), maxScore-1)
		}
	}
	return scores
}

// Quanta of the class grid: a learned shape's cpu is rounded up to whole cores and its memory
// to whole GiB, so that pods of nearly the same size share a class; a node's whole-node shape
// is rounded down to the same grid, so that nodes of one machine model share one.
const (
	MilliCPUQuantum = 1000
	MemoryQuantum   = 1 << 30
)

func roundUp(v, q int64) int64 {
	if v <= 0 {
		return 0
	}
	return (v + q - 1) / q * q
}

func roundDown(v, q int64) int64 {
	if v <= 0 {
		return 0
	}
	return v / q * q
}

// MaxLearnedShapes bounds the shapes a Learner counts: past it, a new shape replaces the least
// frequent one, so a workload of ever-new shapes costs bounded memory and time.
const MaxLearnedShapes = 1024

type counted struct {
	shape Amounts
	n     float64
}

// Learner counts the shapes of the GPU pods it has seen. Counts are halved whenever their
// sum reaches the window, so the model follows a workload that changes. The shapes are kept
// in order of frequency as they are counted, so that the classes cost the same to read
// however many shapes there are.
type Learner struct {
	order  []counted // most frequent first, then by shape
	pos    map[Amounts]int
	total  float64
	window float64
}

// NewLearner starts with no shapes.
func NewLearner(window int) *Learner {
	return &Learner{pos: map[Amounts]int{}, window: float64(max(window, 2))}
}

// before: a is listed before b (more frequent, or as frequent and smaller).
func before(a, b counted) bool {
	if a.n != b.n {
		return a.n > b.n
	}
	return less(a.shape, b.shape)
}

// Observe counts one pod; CPU-only pods are not a GPU class and are not counted.
func (l *Learner) Observe(pod Amounts) {
	if pod.GPUs <= 0 {
		return
	}
	shape := Amounts{
		Kind:     pod.Kind,
		GPUs:     pod.GPUs,
		MilliCPU: roundUp(pod.MilliCPU, MilliCPUQuantum),
		Memory:   roundUp(pod.Memory, MemoryQuantum),
	}
	i, ok := l.pos[shape]
	if !ok {
		if len(l.order) >= MaxLearnedShapes {
			last := l.order[len(l.order)-1]
			delete(l.pos, last.shape)
			l.total -= last.n
			l.order = l.order[:len(l.order)-1]
		}
		l.order = append(l.order, counted{shape: shape})
		i = len(l.order) - 1
	}
	l.order[i].n++
	for ; i > 0 && before(l.order[i], l.order[i-1]); i-- {
		l.order[i], l.order[i-1] = l.order[i-1], l.order[i]
		l.pos[l.order[i].shape] = i
	}
	l.pos[shape] = i
	l.total++
	if l.total >= l.window {
		l.halve()
	}
}

// halve halves every count and forgets the shapes that fall below half a pod; halving keeps
// the order, and the forgotten shapes are its tail.
func (l *Learner) halve() {
	l.total = 0
	kept := l.order[:0]
	for _, c := range l.order {
		if c.n /= 2; c.n < 0.5 {
			delete(l.pos, c.shape)
			continue
		}
		l.pos[c.shape] = len(kept)
		kept = append(kept, c)
		l.total += c.n
	}
	l.order = kept
}

// Classes are the most frequent shapes (at most maxClasses), weighted by their share of the
// counted pods, followed by priors: the given whole-node shapes at priorWeight each, so
// that a node only a whole-node pod fits is kept whole before any such pod has been seen.
func (l *Learner) Classes(maxClasses int, priors []Amounts, priorWeight float64) []Class {
	seen := l.order[:min(len(l.order), max(maxClasses, 0))]
	var sum float64
	for _, c := range seen {
		sum += c.n
	}
	classes := make([]Class, 0, len(seen)+len(priors))
	for _, c := range seen {
		classes = append(classes, Class{Shape: c.shape, Weight: c.n / sum})
	}
	if priorWeight > 0 {
		for _, p := range uniqueShapes(priors) {
			classes = append(classes, Class{Shape: p, Weight: priorWeight})
		}
	}
	return classes
}

func less(a, b Amounts) bool {
	if a.Kind != b.Kind {
		return a.Kind < b.Kind
	}
	if a.GPUs != b.GPUs {
		return a.GPUs < b.GPUs
	}
	if a.MilliCPU != b.MilliCPU {
		return a.MilliCPU < b.MilliCPU
	}
	return a.Memory < b.Memory
}

func compare(a, b Amounts) int {
	switch {
	case less(a, b):
		return -1
	case less(b, a):
		return 1
	}
	return 0
}

// uniqueShapes: the distinct shapes with GPUs, in a stable order.
func uniqueShapes(shapes []Amounts) []Amounts {
	set := map[Amounts]bool{}
	out := []Amounts{}
	for _, s := range shapes {
		if s.GPUs > 0 && !set[s] {
			set[s] = true
			out = append(out, s)
		}
	}
	slices.SortFunc(out, compare)
	return out
}
