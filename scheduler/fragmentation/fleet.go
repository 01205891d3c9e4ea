package fragmentation

import (
	"slices"
)

// Fleet is the model's view of the nodes, kept up to date one node at a time: each node's
// free room and whole-node shape, and for every tracked class shape its supply (how many of
// its pods all nodes together can still take). Setting a node costs one Fits per tracked
// shape, so a scheduling cycle costs what changed since the last one, not the fleet's size;
// only a shape met for the first time is counted over every node, once.
type Fleet struct {
	nodes map[string]*fleetNode
	list  []*fleetNode

	shapes     []tracked
	index      map[Amounts]int
	maxTracked int
	cycle      uint64

	wholes      map[Amounts]int // whole-node shape -> nodes
	gpuNodes    map[int64]int   // GPU units -> nodes
	maxPriors   int
	priors      []Amounts
	priorsStale bool
}

type fleetNode struct {
	name  string
	at    int // index in Fleet.list
	gen   int64
	free  Room
	whole Amounts
	gpus  int64
}

type tracked struct {
	shape  Amounts
	supply int64
	used   uint64 // the last cycle a model asked for it
}

// NewFleet starts with no nodes. maxPriors bounds the whole-node classes (Priors); maxTracked
// how many shapes keep a supply between cycles (at least the classes of one model, so the
// shapes near the cut of the most frequent ones are not counted over and over).
func NewFleet(maxPriors, maxTracked int) *Fleet {
	return &Fleet{
		nodes:       map[string]*fleetNode{},
		index:       map[Amounts]int{},
		maxTracked:  max(maxTracked, 1),
		wholes:      map[Amounts]int{},
		gpuNodes:    map[int64]int{},
		maxPriors:   maxPriors,
		priorsStale: true,
	}
}

// Len is the number of nodes.
func (f *Fleet) Len() int { return len(f.list) }

// Generation is the NodeInfo generation the node was last set from.
func (f *Fleet) Generation(name string) (int64, bool) {
	n, ok := f.nodes[name]
	if !ok {
		return 0, false
	}
	return n.gen, true
}

// Free is the node's free room as last set.
func (f *Fleet) Free(name string) (Room, bool) {
	n, ok := f.nodes[name]
	if !ok {
		return Room{}, false
	}
	return n.free, true
}

// Names of the nodes, in no particular order.
func (f *Fleet) Names() []string {
	names := make([]string, len(f.list))
	for i, n := range f.list {
		names[i] = n.name
	}
	return names
}

// Set records a node's free room, whole-node shape (GPUs 0: none) and GPU units, as read
// from the NodeInfo of generation gen.
func (f *Fleet) Set(name string, gen int64, free Room, whole Amounts, gpus int64) {
	n, ok := f.nodes[name]
	if !ok {
		// A new node starts empty: its zero room fits nothing, it has no whole shape, no GPUs.
		n = &fleetNode{name: name, at: len(f.list)}
		f.nodes[name] = n
		f.list = append(f.list, n)
	}
	n.gen = gen
	for i := range f.shapes {
		class := Class{Shape: f.shapes[i].shape}
		f.shapes[i].supply += class.Fits(&free) - class.Fits(&n.free)
	}
	if n.whole != whole {
		f.countWhole(n.whole, -1)
		f.countWhole(whole, 1)
	}
	if n.gpus != gpus {
		f.countGPUs(n.gpus, -1)
		f.countGPUs(gpus, 1)
	}
	n.free, n.whole, n.gpus = free, whole, gpus
}

// Remove forgets a node (no-op for a node it does not have).
func (f *Fleet) Remove(name string) {
	n, ok := f.nodes[name]
	if !ok {
		return
	}
	for i := range f.shapes {
		f.shapes[i].supply -= Class{Shape: f.shapes[i].shape}.Fits(&n.free)
	}
	f.countWhole(n.whole, -1)
	f.countGPUs(n.gpus, -1)
	last := f.list[len(f.list)-1]
	f.list[n.at], last.at = last, n.at
	f.list = f.list[:len(f.list)-1]
	delete(f.nodes, name)
}

func (f *Fleet) countWhole(s Amounts, sign int) {
	if s.GPUs <= 0 {
		return
	}
	f.priorsStale = true
	if f.wholes[s] += sign; f.wholes[s] <= 0 {
		delete(f.wholes, s)
	}
}

func (f *Fleet) countGPUs(units int64, sign int) {
	if units <= 0 {
		return
	}
	if f.gpuNodes[units] += sign; f.gpuNodes[units] <= 0 {
		delete(f.gpuNodes, units)
	}
}

// Model is the model of the given classes over the fleet: their supply, and the most GPU
// units of any node.
func (f *Fleet) Model(classes []Class) *Model {
	f.cycle++
	m := &Model{Classes: classes, Supply: make([]int64, len(classes))}
	for i, c := range classes {
		m.Supply[i] = f.supply(c.Shape)
	}
	for units := range f.gpuNodes {
		m.MaxGPUs = max(m.MaxGPUs, units)
	}
	f.evict()
	return m
}

func (f *Fleet) supply(shape Amounts) int64 {
	i, ok := f.index[shape]
	if !ok {
		class := Class{Shape: shape}
		var n int64
		for _, node := range f.list {
			n += class.Fits(&node.free)
		}
		i = len(f.shapes)
		f.index[shape] = i
		f.shapes = append(f.shapes, tracked{shape: shape, supply: n})
	}
	f.shapes[i].used = f.cycle
	return f.shapes[i].supply
}

// evict drops the shapes no model has asked for the longest, down to maxTracked.
func (f *Fleet) evict() {
	for len(f.shapes) > f.maxTracked {
		oldest := 0
		for i, s := range f.shapes {
			if s.used < f.shapes[oldest].used {
				oldest = i
			}
		}
		delete(f.index, f.shapes[oldest].shape)
		last := len(f.shapes) - 1
		if oldest != last {
			f.shapes[oldest] = f.shapes[last]
			f.index[f.shapes[oldest].shape] = oldest
		}
		f.shapes = f.shapes[:last]
	}
}

// Priors are the whole-node classes of the fleet (PriorShapes of the nodes' whole shapes),
// recomputed only when a node's whole shape changed.
func (f *Fleet) Priors() []Amounts {
	if f.priorsStale {
		f.priors = PriorShapes(f.wholes, f.maxPriors)
		f.priorsStale = false
	}
	return f.priors
}

// WholeNode is the shape of a pod that would take a whole node whose room (allocatable less
// what system pods request) is r: all the GPUs of its largest whole-GPU kind (whole[k]), with
// the cpu rounded down to whole cores and the memory to whole GiB, so that the nodes of one
// machine model share a shape however their kubelets round. A node without whole GPUs has
// none (GPUs 0): shared replicas and MIG slices are not taken a node at a time.
func WholeNode(r Room, whole *[MaxKinds]bool) Amounts {
	best := -1
	for k, g := range r.GPUs {
		if whole[k] && g > 0 && (best < 0 || g > r.GPUs[best]) {
			best = k
		}
	}
	if best < 0 {
		return Amounts{}
	}
	return Amounts{
		Kind:     Kind(best),
		GPUs:     r.GPUs[best],
		MilliCPU: roundDown(r.MilliCPU, MilliCPUQuantum),
		Memory:   roundDown(r.Memory, MemoryQuantum),
	}
}

// PriorShapes turns the nodes' whole shapes (shape -> nodes) into at most maxPriors prior
// classes. A shape at most one grid step (a core, a GiB) above a smaller one of the same GPUs
// is merged into it (a node a step short on the grid still takes that class), then the shapes
// of the most nodes are kept: a fleet of uneven kubelets gives one class per machine model,
// and no fleet gives more than maxPriors.
func PriorShapes(wholes map[Amounts]int, maxPriors int) []Amounts {
	type group struct {
		shape Amounts
		nodes int
	}
	shapes := make([]Amounts, 0, len(wholes))
	for s := range wholes {
		shapes = append(shapes, s)
	}
	slices.SortFunc(shapes, compare)
	var groups []group
	for _, s := range shapes {
		merged := false
		for i := range groups {
			g := groups[i].shape
			if g.Kind == s.Kind && g.GPUs == s.GPUs &&
				s.MilliCPU >= g.MilliCPU && s.MilliCPU-g.MilliCPU <= MilliCPUQuantum &&
				s.Memory >= g.Memory && s.Memory-g.Memory <= MemoryQuantum {
				groups[i].nodes += wholes[s]
				merged = true
				break
			}
		}
		if !merged {
			groups = append(groups, group{shape: s, nodes: wholes[s]})
		}
	}
	slices.SortStableFunc(groups, func(a, b group) int { return b.nodes - a.nodes })
	out := make([]Amounts, 0, min(len(groups), max(maxPriors, 0)))
	for _, g := range groups[:min(len(groups), max(maxPriors, 0))] {
		out = append(out, g.shape)
	}
	slices.SortFunc(out, compare)
	return out
}
