package fragmentation

import (
	"container/heap"
	"slices"

	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"
	resourcehelper "k8s.io/component-helpers/resource"
	fwk "k8s.io/kube-scheduler/framework"
)

// Gangs: the members of a pending gang are known demand, not a forecast.
//
// With the GenericWorkload feature gate on, a pod names its PodGroup in spec.schedulingGroup
// and kube-scheduler places a PodGroup with a gang policy in one pod group scheduling cycle: its
// queued members one after the other, each through PreFilter, Filter, PreScore, Score and
// Reserve, assumed in the cycle's snapshot only (not in the cache, and without moving the
// node's generation); then every one of them is unreserved and forgotten, and only if at least
// minCount fit are they assumed again, in the cache, and bound. The members not yet placed are
// the snapshot's PodGroupState's UnscheduledPods (the others are assumed or assigned).
// Ref: k8s.io/kubernetes@v1.37.2 pkg/scheduler/schedule_one_podgroup.go, backend/cache/snapshot.go
//
// When it scores a member, the plugin counts the members still pending:
//   - those of the member's own shape follow it: a node's cost is the member's cost there plus
//     what the model charges for placing the rest, one by one on the cheapest node each (the
//     member's node included, with what the member leaves), over the nodes being scored. A
//     node where the rest can follow cheaply (room the gang fills up, a node it breaks only
//     once) wins over a hole that only the first member fits;
//   - those of another shape are classes of their own, weighted 1 (a whole arrival each, not a
//     share of the forecast), with the room they need taken off their supply: the member
//     keeps off the room they cannot do without.
//
// The members assumed in the snapshot only are kept apart (simulated): the fleet is the
// cache's cluster, so that undoing a gang cycle (Unreserve, the snapshot forgetting its pods,
// the generation never moved) leaves it as it was; the model of each member counts the
// members placed before it on top of the fleet.

// followPenalty is what a pending member that no scored node can take adds to the cost.
const followPenalty = 1.0

// gangPending are the amounts of the still-pending members of pod's gang, pod excluded; none
// for a pod outside any PodGroup, in a group without a gang policy, or with the GenericWorkload
// gate off (the snapshot then has no groups).
func (p *Plugin) gangPending(pod *v1.Pod) []Amounts {
	group := pod.Spec.SchedulingGroup
	if group == nil || group.PodGroupName == nil || p.handle == nil {
		return nil
	}
	lister := p.handle.SnapshotSharedLister()
	pg, err := lister.PodGroups().Get(pod.Namespace, *group.PodGroupName)
	if err != nil || pg.Spec.SchedulingPolicy.Gang == nil {
		return nil
	}
	state, err := lister.PodGroupStates().Get(pod.Namespace, *group.PodGroupName)
	if err != nil {
		return nil
	}
	var pending []Amounts
	for _, member := range state.UnscheduledPods() {
		if member.UID != pod.UID {
			pending = append(pending, p.PodAmounts(member))
		}
	}
	return pending
}

// knownDemand splits a gang's pending members into those of pod's own shape (how many) and a
// class per other GPU shape, with how many members need it.
func knownDemand(pending []Amounts, pod Amounts) (same int, classes []Class, counts []int64) {
	byShape := map[Amounts]int64{}
	for _, a := range pending {
		switch {
		case a == pod:
			same++
		case a.GPUs > 0:
			byShape[Amounts{Kind: a.Kind, GPUs: a.GPUs, MilliCPU: roundUp(a.MilliCPU, MilliCPUQuantum), Memory: roundUp(a.Memory, MemoryQuantum)}]++
		}
	}
	shapes := make([]Amounts, 0, len(byShape))
	for s := range byShape {
		shapes = append(shapes, s)
	}
	slices.SortFunc(shapes, compare)
	for _, s := range shapes {
		classes = append(classes, Class{Shape: s, Weight: 1})
		counts = append(counts, byShape[s])
	}
	return same, classes, counts
}

// simulated are the pods a pod group cycle placed in the snapshot only, and their room by node
// (p.mu held).
type simulated struct {
	pods  map[types.UID]simulatedPod
	nodes map[string]Room
}

type simulatedPod struct {
	node string
	room Room
}

func (s *simulated) add(uid types.UID, node string, room Room) {
	if s.pods == nil {
		s.pods, s.nodes = map[types.UID]simulatedPod{}, map[string]Room{}
	}
	if _, ok := s.pods[uid]; ok {
		return
	}
	s.pods[uid] = simulatedPod{node: node, room: room}
	s.nodes[node] = s.nodes[node].Add(room)
}

func (s *simulated) remove(uid types.UID) {
	sp, ok := s.pods[uid]
	if !ok {
		return
	}
	delete(s.pods, uid)
	if left := s.nodes[sp.node].Sub(sp.room); left == (Room{}) {
		delete(s.nodes, sp.node)
	} else {
		s.nodes[sp.node] = left
	}
}

// simulate records pod, placed on node by a pod group cycle in the snapshot only, with what the
// snapshot's NodeInfo counts for it.
func (p *Plugin) simulate(pod *v1.Pod, node string) {
	var room Room
	found := false
	if info, err := p.handle.SnapshotSharedLister().NodeInfos().Get(node); err == nil {
		for _, pi := range info.GetPods() {
			if pi.GetPod().UID == pod.UID {
				room, found = p.res.room(pi.CalculateResource().Resource), true
				break
			}
		}
	}
	if !found {
		room = p.res.amounts(resourcehelper.PodRequests(pod, resourcehelper.PodResourcesOptions{}))
	}
	p.mu.Lock()
	p.sim.add(pod.UID, node, room)
	p.mu.Unlock()
}

// unsimulate forgets a pod the pod group cycle took back out of the snapshot.
func (p *Plugin) unsimulate(pod *v1.Pod) {
	p.mu.Lock()
	p.sim.remove(pod.UID)
	p.mu.Unlock()
}

// withSimulated is the model's supplies with the simulated pods placed on top of the fleet
// (p.mu held).
func (p *Plugin) withSimulated(m *Model) {
	for name, room := range p.sim.nodes {
		committed, ok := p.fleet.Free(name)
		if !ok {
			continue
		}
		placed := committed.Sub(room)
		for c, class := range m.Classes {
			m.Supply[c] += class.Fits(&placed) - class.Fits(&committed)
		}
	}
}

// isGroupCycle: the cycle places a member of a pod group in the snapshot only.
func isGroupCycle(state fwk.CycleState) bool {
	return state != nil && state.IsPodGroupSchedulingCycle()
}

// event is one pod placed by the greedy run: on which node, at what cost.
type event struct {
	node int
	cost float64
}

// follow computes, for each node, the cost of placing rest more pods of shape pod greedily
// (each on the node it costs least on) over the nodes of frees once pod is placed on that
// node. A node's costs, pod after pod, are computed only as far as the run reaches them.
type follow struct {
	m      *Model
	pod    Amounts
	chains [][]float64 // per node, the cost of its 1st, 2nd, ... pod of the shape
	after  []Room      // per node, its room once its chain's pods are placed
	ends   []bool      // the chain is complete (the node takes no more)
	run    []event     // the greedy run over every node
	heads  eventHeap
	limit  int // no chain needs more than rest+1 pods
}

// Followers returns, per node of frees, the cost of the rest once pod is on that node (0 for
// a node pod does not fit).
func (m *Model) Followers(pod Amounts, rest int, frees []Room) []float64 {
	f := &follow{m: m, pod: pod, chains: make([][]float64, len(frees)), after: slices.Clone(frees), ends: make([]bool, len(frees)), limit: rest + 1}
	for i := range frees {
		if c, ok := f.at(i, 0); ok {
			f.heads = append(f.heads, headOf(i, 0, c))
		}
	}
	heap.Init(&f.heads)
	out := make([]float64, len(frees))
	for n := range frees {
		if _, ok := f.at(n, 0); !ok {
			continue
		}
		var sum float64
		own, k := 1, 0 // n's next pod (its first is the scored member); the run's next event
		for range rest {
			ownCost, ownOK := f.at(n, own)
			other, otherOK := f.next(n, &k)
			switch {
			case ownOK && (!otherOK || ownCost <= other.cost):
				sum += ownCost
				own++
			case otherOK:
				sum += other.cost
				k++
			default:
				sum += followPenalty
			}
		}
		out[n] = sum
	}
	return out
}

// at is the cost of node i's j-th pod (from 0), if it takes that many.
func (f *follow) at(i, j int) (float64, bool) {
	for len(f.chains[i]) <= j && !f.ends[i] {
		if len(f.chains[i]) >= f.limit || (Class{Shape: f.pod}).Fits(&f.after[i]) == 0 {
			f.ends[i] = true
			break
		}
		f.chains[i] = append(f.chains[i], f.m.Cost(f.after[i], f.pod))
		f.after[i] = f.after[i].Take(f.pod)
	}
	if j < len(f.chains[i]) {
		return f.chains[i][j], true
	}
	return 0, false
}

// next is the greedy run's first event from k on that is not on node n (k moves to it).
func (f *follow) next(n int, k *int) (event, bool) {
	for ; ; *k++ {
		for len(f.run) <= *k {
			if len(f.heads) == 0 {
				return event{}, false
			}
			h := heap.Pop(&f.heads).(head)
			f.run = append(f.run, event{node: h.node, cost: h.cost})
			if c, ok := f.at(h.node, h.j+1); ok {
				heap.Push(&f.heads, headOf(h.node, h.j+1, c))
			}
		}
		if e := f.run[*k]; e.node != n {
			return e, true
		}
	}
}

// head is a node's next pod in the greedy run.
type head struct {
	node, j int
	cost    float64
}

func headOf(node, j int, cost float64) head { return head{node: node, j: j, cost: cost} }

// eventHeap orders heads by cost, then node (a deterministic run).
type eventHeap []head

func (h eventHeap) Len() int { return len(h) }
func (h eventHeap) Less(a, b int) bool {
	if h[a].cost != h[b].cost {
		return h[a].cost < h[b].cost
	}
	return h[a].node < h[b].node
}
func (h eventHeap) Swap(a, b int) { h[a], h[b] = h[b], h[a] }
func (h *eventHeap) Push(x any)   { *h = append(*h, x.(head)) }
func (h *eventHeap) Pop() any {
	old := *h
	x := old[len(old)-1]
	*h = old[:len(old)-1]
	return x
}
