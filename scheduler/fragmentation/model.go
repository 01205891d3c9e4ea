package fragmentation

import (
	"math"
	"sort"
)

// Amounts are what a pod requests, or what a node has free: whole GPUs (the sum over the
// configured GPU resources), milli-cpu and memory bytes.
type Amounts struct {
	GPUs     int64
	MilliCPU int64
	Memory   int64
}

// Sub returns a - b.
func (a Amounts) Sub(b Amounts) Amounts {
	return Amounts{GPUs: a.GPUs - b.GPUs, MilliCPU: a.MilliCPU - b.MilliCPU, Memory: a.Memory - b.Memory}
}

// Class is one pod shape of the workload model with its share of the arrivals.
type Class struct {
	Shape  Amounts
	Weight float64
}

// Fits is how many pods of the class fit in free: as many as the GPUs, the cpu and the
// memory allow together. A class that asks for no cpu (or memory) is not limited by it.
func (c Class) Fits(free Amounts) int64 {
	if c.Shape.GPUs <= 0 || free.GPUs < c.Shape.GPUs {
		return 0
	}
	n := free.GPUs / c.Shape.GPUs
	if c.Shape.MilliCPU > 0 {
		n = min(n, max(free.MilliCPU, 0)/c.Shape.MilliCPU)
	}
	if c.Shape.Memory > 0 {
		n = min(n, max(free.Memory, 0)/c.Shape.Memory)
	}
	return n
}

// Stranded is how many of free's GPUs are left over once as many pods of the class as fit
// are placed: GPUs scattered below the class's count and GPUs whose cpu or memory is gone
// count alike (FGD's fragmentation, for whole GPUs and the node's other resources).
func (c Class) Stranded(free Amounts) int64 {
	if free.GPUs <= 0 {
		return 0
	}
	return free.GPUs - c.Fits(free)*c.Shape.GPUs
}

// Model is the workload the score protects: the classes and, per class, how many pods of
// it the whole cluster can still take (its supply).
type Model struct {
	Classes []Class
	Supply  []int64
	// MaxGPUs is the most GPUs any node has; it scales the fragmentation term.
	MaxGPUs int64
}

// NewModel computes each class's supply over the free amounts of every node.
func NewModel(classes []Class, nodesFree []Amounts, nodesGPUs []int64) *Model {
	m := &Model{Classes: classes, Supply: make([]int64, len(classes))}
	for i, free := range nodesFree {
		for c, class := range classes {
			m.Supply[c] += class.Fits(free)
		}
		m.MaxGPUs = max(m.MaxGPUs, nodesGPUs[i])
	}
	return m
}

// TieBreak weighs the fragmentation term against the loss of scarce room: it only orders
// placements that use up the same share of every class's room.
const TieBreak = 0.01

// Cost of placing pod on a node with free amounts; lower is better. The main term is the
// share of each class's remaining room in the cluster that the placement uses up, weighted by
// the class's share of the arrivals: room for a shape few nodes can still take (a whole
// 8-GPU node with its cpu) costs more than room for a shape most nodes offer. The second
// term is the GPUs the placement leaves stranded for the classes (FGD's fragmentation delta).
func (m *Model) Cost(free, pod Amounts) float64 {
	after := free.Sub(pod)
	var lost, stranded float64
	for c, class := range m.Classes {
		if delta := class.Fits(free) - class.Fits(after); delta != 0 {
			lost += class.Weight * float64(delta) / float64(max(m.Supply[c], 1))
		}
		stranded += class.Weight * float64(class.Stranded(after)-class.Stranded(free))
	}
	return lost + TieBreak*stranded/float64(max(m.MaxGPUs, 1))
}

// Normalize maps costs to scores from 0 (the highest cost) to maxScore (the lowest),
// linearly; with all costs equal every node scores maxScore.
func Normalize(costs []float64, maxScore int64) []int64 {
	scores := make([]int64, len(costs))
	if len(costs) == 0 {
		return scores
	}
	lo, hi := costs[0], costs[0]
	for _, c := range costs {
		lo, hi = min(lo, c), max(hi, c)
	}
	for i, c := range costs {
		if c <= lo { // exactly: the best nodes must not lose a point to rounding
			scores[i] = maxScore
			continue
		}
		scores[i] = min(int64(math.Floor(float64(maxScore)*((hi-c)/(hi-lo)))), maxScore-1)
	}
	return scores
}

// Quanta of the learned shapes: a pod's cpu is rounded up to whole cores and its memory to
// whole GiB, so that pods of nearly the same size share a class.
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

// Learner counts the shapes of the GPU pods it has seen. Counts are halved whenever their
// sum reaches the window, so the model follows a workload that changes.
type Learner struct {
	counts map[Amounts]float64
	total  float64
	window float64
}

// NewLearner starts with no shapes.
func NewLearner(window int) *Learner {
	return &Learner{counts: map[Amounts]float64{}, window: float64(max(window, 2))}
}

// Observe counts one pod; CPU-only pods are not a GPU class and are not counted.
func (l *Learner) Observe(pod Amounts) {
	if pod.GPUs <= 0 {
		return
	}
	shape := Amounts{
		GPUs:     pod.GPUs,
		MilliCPU: roundUp(pod.MilliCPU, MilliCPUQuantum),
		Memory:   roundUp(pod.Memory, MemoryQuantum),
	}
	l.counts[shape]++
	l.total++
	if l.total >= l.window {
		l.total = 0
		for s, n := range l.counts {
			if n /= 2; n < 0.5 {
				delete(l.counts, s)
				continue
			}
			l.counts[s] = n
			l.total += n
		}
	}
}

// Classes are the most frequent shapes (at most maxClasses), weighted by their share of the
// counted pods, followed by priors: one class per node shape (a pod taking the whole node)
// at priorWeight each, so that a node only a whole-node pod fits is kept whole before any
// such pod has been seen.
func (l *Learner) Classes(maxClasses int, priors []Amounts, priorWeight float64) []Class {
	type counted struct {
		shape Amounts
		n     float64
	}
	seen := make([]counted, 0, len(l.counts))
	for s, n := range l.counts {
		seen = append(seen, counted{s, n})
	}
	sort.Slice(seen, func(i, j int) bool {
		if seen[i].n != seen[j].n {
			return seen[i].n > seen[j].n
		}
		return less(seen[i].shape, seen[j].shape)
	})
	if len(seen) > maxClasses {
		seen = seen[:maxClasses]
	}
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
	if a.GPUs != b.GPUs {
		return a.GPUs < b.GPUs
	}
	if a.MilliCPU != b.MilliCPU {
		return a.MilliCPU < b.MilliCPU
	}
	return a.Memory < b.Memory
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
	sort.Slice(out, func(i, j int) bool { return less(out[i], out[j]) })
	return out
}
