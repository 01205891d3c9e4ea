package fragmentation

import (
	"regexp"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"

	v1 "k8s.io/api/core/v1"
	"k8s.io/klog/v2"
	fwk "k8s.io/kube-scheduler/framework"
)

// What a GPU resource is worth, in GPU units (a whole GPU is the config's unit count, the
// least common multiple of the MIG slices and of every shared resource's replicas, so that
// every amount is exact):
//   - a whole-GPU resource (gpuResources, default nvidia.com/gpu): one GPU per item;
//   - a shared resource (sharedResources, time-slicing or MPS replicas): 1/replicas of a GPU
//     per item. The device plugin's sharing config gives every GPU of a resource the same
//     replica count, and the GPU Operator layer renders one such config for the cluster, so the
//     count is an argument rather than read per node;
//   - a MIG profile (a name under migResourcePrefix, mig.strategy mixed): the profile's slices
//     of one GPU, <g> of migSlices for nvidia.com/mig-<g>g.<mem>gb, or <c> for a compute
//     instance profile nvidia.com/mig-<c>c.<g>g.<mem>gb (<c> of the GPU instance's <g>).
//
// Each resource is its own kind: a pod of one kind only fits GPUs of that kind.
// Ref: https://docs.nvidia.com/datacenter/cloud-native/gpu-operator/latest/gpu-sharing.html
// Ref: https://docs.nvidia.com/datacenter/tesla/mig-user-guide/#supported-mig-profiles
var migProfile = regexp.MustCompile(`^(?:([1-9][0-9]*)c\.)?([1-9][0-9]*)g\.[0-9]+gb(?:\+.*)?$`)

type kindInfo struct {
	name  v1.ResourceName
	units int64 // GPU units per item of the resource
}

// kindTable is immutable once published; a MIG profile met for the first time (or a name
// found not to be a GPU resource) publishes a copy.
type kindTable struct {
	kinds  []kindInfo
	byName map[v1.ResourceName]int // index into kinds, or -1: not a GPU resource
}

// resources maps resource names to GPU kinds and units. Lookups are lock-free (Score runs on
// many nodes at once); only a name met for the first time takes the lock.
type resources struct {
	migPrefix string
	migSlices int64
	unit      int64
	whole     [MaxKinds]bool

	mu    sync.Mutex
	table atomic.Pointer[kindTable]
}

func newResources(c config) *resources {
	r := &resources{migPrefix: c.migPrefix, migSlices: c.migSlices, unit: c.unit}
	t := &kindTable{byName: map[v1.ResourceName]int{}}
	for _, name := range c.gpuResources {
		r.whole[len(t.kinds)] = true
		t.byName[name] = len(t.kinds)
		t.kinds = append(t.kinds, kindInfo{name: name, units: c.unit})
	}
	for _, s := range c.shared {
		t.byName[s.name] = len(t.kinds)
		t.kinds = append(t.kinds, kindInfo{name: s.name, units: c.unit / s.replicas})
	}
	r.table.Store(t)
	return r
}

// lookup: the resource's kind and GPU units per item; ok false for a resource that is not a GPU.
func (r *resources) lookup(name v1.ResourceName) (Kind, int64, bool) {
	t := r.table.Load()
	if i, ok := t.byName[name]; ok {
		if i < 0 {
			return 0, 0, false
		}
		return Kind(i), t.kinds[i].units, true
	}
	return r.learn(name)
}

func (r *resources) learn(name v1.ResourceName) (Kind, int64, bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	old := r.table.Load()
	if i, ok := old.byName[name]; ok {
		if i < 0 {
			return 0, 0, false
		}
		return Kind(i), old.kinds[i].units, true
	}
	t := &kindTable{kinds: old.kinds, byName: make(map[v1.ResourceName]int, len(old.byName)+1)}
	for n, i := range old.byName {
		t.byName[n] = i
	}
	t.byName[name] = -1
	n, isMIG := r.migSlicesOf(name)
	switch {
	case !isMIG:
	case n <= 0:
		klog.InfoS("GpuFragmentation: not a MIG profile name, not counted as GPUs", "resource", name)
	case len(old.kinds) >= MaxKinds:
		klog.InfoS("GpuFragmentation: too many GPU resources, not counted as GPUs", "resource", name, "max", MaxKinds)
	default:
		t.byName[name] = len(old.kinds)
		t.kinds = append(old.kinds[:len(old.kinds):len(old.kinds)], kindInfo{name: name, units: n * r.unit / r.migSlices})
	}
	r.table.Store(t)
	if i := t.byName[name]; i >= 0 {
		return Kind(i), t.kinds[i].units, true
	}
	return 0, 0, false
}

// migSlicesOf: whether name is under the MIG prefix and, if its profile parses, how many of
// the GPU's slices it takes (capped at migSlices); 0 for a name under the prefix that does not.
func (r *resources) migSlicesOf(name v1.ResourceName) (int64, bool) {
	if r.migPrefix == "" || !strings.HasPrefix(string(name), r.migPrefix) {
		return 0, false
	}
	m := migProfile.FindStringSubmatch(strings.TrimPrefix(string(name), r.migPrefix))
	if m == nil {
		return 0, true
	}
	n := m[2]
	if m[1] != "" {
		n = m[1]
	}
	slices, err := strconv.ParseInt(n, 10, 64)
	if err != nil {
		return 0, true
	}
	return min(slices, r.migSlices), true
}

// amounts is what a resource list asks for: cpu, memory and GPU units per kind.
func (r *resources) amounts(list v1.ResourceList) Room {
	room := Room{MilliCPU: list.Cpu().MilliValue(), Memory: list.Memory().Value()}
	for name, q := range list {
		if k, units, ok := r.lookup(name); ok {
			room.GPUs[k] += q.Value() * units
		}
	}
	return room
}

// known is a scheduler Resource as a Room, counting the GPU resources already known only: a
// lookup per kind rather than a walk over every scalar resource (Score's path, node by node;
// every node was read with room, which learns its MIG profiles, by the cycle's PreScore).
func (r *resources) known(res fwk.Resource) Room {
	room := Room{MilliCPU: res.GetMilliCPU(), Memory: res.GetMemory()}
	scalars := res.GetScalarResources()
	if len(scalars) == 0 {
		return room
	}
	for k, kind := range r.table.Load().kinds {
		room.GPUs[k] = scalars[kind.name] * kind.units
	}
	return room
}

// room is a scheduler Resource (a node's allocatable or requested) as a Room.
func (r *resources) room(res fwk.Resource) Room {
	room := Room{MilliCPU: res.GetMilliCPU(), Memory: res.GetMemory()}
	for name, n := range res.GetScalarResources() {
		if k, units, ok := r.lookup(name); ok {
			room.GPUs[k] += n * units
		}
	}
	return room
}

// shape is a pod's request as a shape of one kind: the kind it asks most GPU units of (a pod
// asking for two GPU resources, which no NVIDIA setup advertises together on one node, is
// shaped by its main one).
func shape(req Room) Amounts {
	a := Amounts{MilliCPU: req.MilliCPU, Memory: req.Memory}
	for k, g := range req.GPUs {
		if g > a.GPUs {
			a.Kind, a.GPUs = Kind(k), g
		}
	}
	return a
}

func gcd(a, b int64) int64 {
	for b != 0 {
		a, b = b, a%b
	}
	return a
}

func lcm(a, b int64) int64 { return a / gcd(a, b) * b }
