package fragmentation

import (
	"container/heap"
	"hash/maphash"
	"math"
	"slices"
	"sync"

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
			pending = append(pending, p.amountsOf(member, p.members.of(member)))
		}
	}
	return pending
}

// maxMemberRequests bounds the pods memberRequests holds: past it, it starts over.
const maxMemberRequests = 4096

// memberRequests remembers what the pending members of gangs request: each member of a gang of
// n counts the n-1 others, one cycle after the other. A pod's requests are a function of the
// pod object alone, and the informers replace an object rather than change it, so one is
// reused only for the very object it was worked out from.
type memberRequests struct {
	mu    sync.Mutex
	byUID map[types.UID]memberRequest
}

type memberRequest struct {
	pod *v1.Pod
	req v1.ResourceList
}

// of is resourcehelper.PodRequests of pod, worked out once per pod object.
func (r *memberRequests) of(pod *v1.Pod) v1.ResourceList {
	r.mu.Lock()
	defer r.mu.Unlock()
	if m, ok := r.byUID[pod.UID]; ok && m.pod == pod {
		return m.req
	}
	if r.byUID == nil || len(r.byUID) >= maxMemberRequests {
		r.byUID = map[types.UID]memberRequest{}
	}
	req := resourcehelper.PodRequests(pod, resourcehelper.PodResourcesOptions{})
	r.byUID[pod.UID] = memberRequest{pod: pod, req: req}
	return req
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
// node. A node's costs, pod after pod, depend on its free room only: nodes of the same room
// share one chain, computed only as far as the run reaches it.
type follow struct {
	m      *Model
	pod    Amounts
	frees  []Room
	chains []chain
	of     []int32 // per node, its chain
	run    []event // the greedy run over every node
	heads  eventHeap
	limit  int // no chain needs more than rest+1 pods
}

// chain is the cost of the 1st, 2nd, ... pod of the shape on the free room of frees[node].
type chain struct {
	costs []float64
	node  int32
	end   bool // the chain is complete (the room takes no more)
}

// Followers returns, per node of frees, the cost of the rest once pod is on that node (0 for
// a node pod does not fit).
//
// A node's cost merges the greedy run over every node, the node's own pods left out, with the
// node's chain from its second pod on. A node with none of the run's first rest events meets
// no other events in the merge, so every such node of one room costs the same: that cost is
// worked out once per room, and only the (at most rest) nodes of the run's head one by one.
func (m *Model) Followers(pod Amounts, rest int, frees []Room) []float64 {
	f := &follow{m: m, pod: pod, frees: frees, chains: make([]chain, 0, len(frees)), of: make([]int32, len(frees)), limit: rest + 1}
	// Most chains stop at the node's second pod: their costs share one array.
	costs := make([]float64, 2*len(frees))
	seed := maphash.MakeSeed()
	byRoom := make(map[uint64]int32, len(frees))
	for i := range frees {
		h := maphash.Comparable(seed, frees[i])
		c, ok := byRoom[h]
		if !ok || frees[f.chains[c].node] != frees[i] {
			c = int32(len(f.chains))
			f.chains = append(f.chains, chain{costs: costs[2*c : 2*c : 2*c+2], node: int32(i)})
			if !ok { // a collision only loses the sharing
				byRoom[h] = c
			}
		}
		f.of[i] = c
		if cost, ok := f.at(c, 0); ok {
			f.heads = append(f.heads, headOf(i, 0, cost))
		}
	}
	heap.Init(&f.heads)
	// The run's head: its first rest events (fewer if the nodes take fewer pods), on at most
	// rest nodes, and its dearest event.
	inHead := map[int]bool{}
	top := math.Inf(-1)
	for k := range rest {
		e, ok := f.event(k)
		if !ok {
			break
		}
		inHead[e.node] = true
		top = max(top, e.cost)
	}
	// A node outside the head whose own second pod is dearer than every event of a full head
	// (or that takes no second pod) follows the head alone.
	alone := f.rest(-1, -1, rest)
	full := len(f.run) >= rest
	byChain := make([]float64, len(f.chains)) // the cost of a node outside the head, by room
	done := make([]bool, len(f.chains))
	out := make([]float64, len(frees))
	for n := range frees {
		c := f.of[n]
		switch {
		case len(f.chains[c].costs) == 0: // pod does not fit
		case inHead[n]:
			out[n] = f.rest(n, c, rest)
		case !done[c]:
			if second, ok := f.at(c, 1); !ok || (full && second > top) {
				byChain[c] = alone
			} else {
				byChain[c] = f.rest(n, c, rest)
			}
			done[c] = true
			fallthrough
		default:
			out[n] = byChain[c]
		}
	}
	return out
}

// rest is the cost of rest pods after node n's first (chain c; -1 for none, n -1 for no
// node): each the cheaper of n's next pod and the run's next event on another node (n's pod
// on a tie), followPenalty when neither is left.
func (f *follow) rest(n int, c int32, rest int) float64 {
	var sum float64
	own, k := 1, 0 // n's next pod (its first is the scored member); the run's next event
	ownCost, ownOK := 0.0, false
	if c >= 0 {
		ownCost, ownOK = f.at(c, own)
	}
	for range rest {
		var other event
		otherOK := k < len(f.run) && f.run[k].node != n
		if otherOK {
			other = f.run[k] // the run's head is out already
		} else {
			other, otherOK = f.next(n, &k)
		}
		switch {
		case ownOK && (!otherOK || ownCost <= other.cost):
			sum += ownCost
			own++
			ownCost, ownOK = f.at(c, own)
		case otherOK:
			sum += other.cost
			k++
		default:
			sum += followPenalty
		}
	}
	return sum
}

// at is the cost of chain c's j-th pod (from 0), if its room takes that many.
func (f *follow) at(c int32, j int) (float64, bool) {
	ch := &f.chains[c]
	for len(ch.costs) <= j && !ch.end {
		taken := int64(len(ch.costs)) // the pods before this one, all of shape pod
		after := f.frees[ch.node].Take(Amounts{Kind: f.pod.Kind, GPUs: taken * f.pod.GPUs, MilliCPU: taken * f.pod.MilliCPU, Memory: taken * f.pod.Memory})
		if len(ch.costs) >= f.limit || (Class{Shape: f.pod}).Fits(&after) == 0 {
			ch.end = true
			break
		}
		ch.costs = append(ch.costs, f.m.Cost(after, f.pod))
	}
	if j < len(ch.costs) {
		return ch.costs[j], true
	}
	return 0, false
}

// event is the greedy run's k-th event (from 0), if it has that many.
func (f *follow) event(k int) (event, bool) {
	for len(f.run) <= k {
		if len(f.heads) == 0 {
			return event{}, false
		}
		h := heap.Pop(&f.heads).(head)
		f.run = append(f.run, event{node: h.node, cost: h.cost})
		if c, ok := f.at(f.of[h.node], h.j+1); ok {
			heap.Push(&f.heads, headOf(h.node, h.j+1, c))
		}
	}
	return f.run[k], true
}

// next is the greedy run's first event from k on that is not on node n (k moves to it).
func (f *follow) next(n int, k *int) (event, bool) {
	for ; ; *k++ {
		e, ok := f.event(*k)
		if !ok || e.node != n {
			return e, ok
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
