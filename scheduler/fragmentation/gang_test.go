package fragmentation

import (
	"context"
	"fmt"
	"slices"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
	schedulingv1beta1 "k8s.io/api/scheduling/v1beta1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	utilfeature "k8s.io/apiserver/pkg/util/feature"
	featuregatetesting "k8s.io/component-base/featuregate/testing"
	"k8s.io/klog/v2"
	fwk "k8s.io/kube-scheduler/framework"
	"k8s.io/kubernetes/pkg/features"
	"k8s.io/kubernetes/pkg/scheduler/backend/cache"
	"k8s.io/kubernetes/pkg/scheduler/framework"
	"k8s.io/kubernetes/pkg/scheduler/metrics"
)

// gangEnv is kube-scheduler's cache and snapshot, with the GenericWorkload feature gate on or
// off, and the plugin on that snapshot. Pods are placed as kube-scheduler v1.37.2 places them
// (pkg/scheduler/schedule_one.go, schedule_one_podgroup.go): a pod alone is scored, assumed in
// the cache and reserved; a gang's members, in a pod group cycle, one after the other, each
// scored, assumed in the snapshot only and reserved, then all unreserved and forgotten, and, if
// at least minCount fit, assumed in the cache, reserved again and bound. Filtering is
// NodeResourcesFit's; the best score wins, ties to the first node by name (kube-scheduler
// draws among them). What it leaves out: Permit (GangScheduling's wait for the quorum) and the
// binding API calls.
type gangEnv struct {
	t        *testing.T
	cache    cache.Cache
	snapshot *cache.Snapshot
	logger   klog.Logger
	p        *Plugin
	gate     bool
}

func newGangEnv(t *testing.T, gate bool, nodes []*v1.Node, bound, seen []*v1.Pod) *gangEnv {
	t.Helper()
	featuregatetesting.SetFeatureGateDuringTest(t, utilfeature.DefaultFeatureGate, features.GenericWorkload, gate)
	metrics.Register()
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	e := &gangEnv{t: t, cache: cache.New(ctx, nil, gate, false), snapshot: cache.NewEmptySnapshot(), logger: klog.FromContext(ctx), gate: gate}
	for _, n := range nodes {
		e.cache.AddNode(e.logger, n)
	}
	for _, pod := range bound {
		if err := e.cache.AddPod(e.logger, pod); err != nil {
			t.Fatal(err)
		}
	}
	e.sync()
	e.p = newPlugin(t, e.snapshot, Args{})
	for _, pod := range seen { // pods the scheduler tried before: the model learns them
		e.p.PreFilter(ctx, framework.NewCycleState(), pod, nil)
	}
	return e
}

func (e *gangEnv) sync() {
	e.t.Helper()
	if err := e.cache.UpdateSnapshot(e.logger, e.snapshot); err != nil {
		e.t.Fatal(err)
	}
}

// gang is a PodGroup with a gang policy of minCount and its pending members, of one shape.
func (e *gangEnv) gang(name string, members, minCount int, gpus int, cpu, mem string) []*v1.Pod {
	e.cache.AddPodGroup(&schedulingv1beta1.PodGroup{
		ObjectMeta: metav1.ObjectMeta{Namespace: metav1.NamespaceDefault, Name: name},
		Spec: schedulingv1beta1.PodGroupSpec{SchedulingPolicy: schedulingv1beta1.PodGroupSchedulingPolicy{
			Gang: &schedulingv1beta1.GangSchedulingPolicy{MinCount: int32(minCount)},
		}},
	})
	var pods []*v1.Pod
	for i := range members {
		pod := gpuPod(fmt.Sprintf("%s-%d", name, i), "", gpus, cpu, mem)
		pod.Namespace = metav1.NamespaceDefault
		pod.Spec.SchedulingGroup = &v1.PodSchedulingGroup{PodGroupName: &name}
		e.cache.AddPodGroupMember(pod)
		pods = append(pods, pod)
	}
	return pods
}

// best runs PreFilter, PreScore, Score and NormalizeScore for pod over the nodes it fits and
// returns the best one ("" if it fits none).
func (e *gangEnv) best(state *framework.CycleState, pod *v1.Pod) string {
	e.t.Helper()
	ctx := context.Background()
	all, _ := e.snapshot.NodeInfos().List()
	if _, s := e.p.PreFilter(ctx, state, pod, all); !s.IsSuccess() && !s.IsSkip() {
		e.t.Fatalf("PreFilter: %v", s)
	}
	var feasible []fwk.NodeInfo
	for _, n := range all {
		if n.Node() != nil && fits(pod, n) {
			feasible = append(feasible, n)
		}
	}
	if len(feasible) == 0 {
		return ""
	}
	slices.SortFunc(feasible, func(a, b fwk.NodeInfo) int { return compareNames(a.Node().Name, b.Node().Name) })
	if s := e.p.PreScore(ctx, state, pod, feasible); !s.IsSuccess() {
		e.t.Fatalf("PreScore: %v", s)
	}
	var list fwk.NodeScoreList
	for _, n := range feasible {
		score, s := e.p.Score(ctx, state, pod, n)
		if !s.IsSuccess() {
			e.t.Fatalf("Score: %v", s)
		}
		list = append(list, fwk.NodeScore{Name: n.Node().Name, Score: score})
	}
	if s := e.p.NormalizeScore(ctx, state, pod, list); !s.IsSuccess() {
		e.t.Fatalf("NormalizeScore: %v", s)
	}
	top := list[0]
	for _, s := range list[1:] {
		if s.Score > top.Score {
			top = s
		}
	}
	return top.Name
}

func compareNames(a, b string) int {
	switch {
	case a < b:
		return -1
	case a > b:
		return 1
	}
	return 0
}

// bind assumes pod on node in the cache, reserves it and confirms the binding, the plugin
// hearing of it as in kube-scheduler.
func (e *gangEnv) bind(pod *v1.Pod, node string) {
	e.t.Helper()
	assumed := pod.DeepCopy()
	assumed.Spec.NodeName = node
	if err := e.cache.AssumePod(e.logger, assumed); err != nil {
		e.t.Fatal(err)
	}
	e.p.Reserve(context.Background(), framework.NewCycleState(), assumed, node)
	if err := e.cache.AddPod(e.logger, assumed); err != nil {
		e.t.Fatal(err)
	}
	e.p.onPod(assumed)
}

// alone places each pod in its own cycle, as kube-scheduler places pods outside any group;
// it returns the node of each ("" for none).
func (e *gangEnv) alone(pods []*v1.Pod) []string {
	var placed []string
	for _, pod := range pods {
		e.sync()
		node := e.best(framework.NewCycleState(), pod)
		if node != "" {
			e.bind(pod, node)
		}
		placed = append(placed, node)
	}
	return placed
}

// groupCycle places a gang's members in one pod group cycle and, if at least minCount fit,
// binds them; it returns the node each member was given in the cycle ("" for none) and
// whether the gang was bound. inCycle runs after each member is placed, before the next.
func (e *gangEnv) groupCycle(members []*v1.Pod, minCount int, inCycle func()) ([]string, bool) {
	e.t.Helper()
	e.sync()
	group := framework.NewCycleState()
	type placed struct {
		state *framework.CycleState
		pod   *v1.Pod
	}
	var done []placed
	nodes := make([]string, len(members))
	for i, pod := range members {
		state := framework.NewCycleState()
		state.SetPodGroupSchedulingCycle(group)
		node := e.best(state, pod)
		if node == "" {
			continue
		}
		nodes[i] = node
		assumed := pod.DeepCopy()
		assumed.Spec.NodeName = node
		pi, err := framework.NewPodInfo(assumed)
		if err != nil {
			e.t.Fatal(err)
		}
		if err := e.snapshot.AssumePod(pi); err != nil {
			e.t.Fatal(err)
		}
		if s := e.p.Reserve(context.Background(), state, assumed, node); !s.IsSuccess() {
			e.t.Fatalf("Reserve: %v", s)
		}
		done = append(done, placed{state, assumed})
		if inCycle != nil {
			inCycle()
		}
	}
	for i := len(done) - 1; i >= 0; i-- { // undone last in, first out, as kube-scheduler does
		e.p.Unreserve(context.Background(), done[i].state, done[i].pod, done[i].pod.Spec.NodeName)
		if err := e.snapshot.ForgetPod(e.logger, done[i].pod); err != nil {
			e.t.Fatal(err)
		}
	}
	if len(done) < minCount {
		return nodes, false
	}
	for _, d := range done {
		e.bind(d.pod, d.pod.Spec.NodeName)
	}
	return nodes, true
}

// wholeNodes counts the nodes with all their GPUs free.
func (e *gangEnv) wholeNodes() int {
	e.sync()
	all, _ := e.snapshot.NodeInfos().List()
	n := 0
	for _, info := range all {
		free, alloc := e.p.Free(info), e.p.res.room(info.GetAllocatable())
		if info.Node() != nil && free.TotalGPUs() == alloc.TotalGPUs() {
			n++
		}
	}
	return n
}

func distinct(nodes []string) int {
	set := map[string]bool{}
	for _, n := range nodes {
		set[n] = true
	}
	return len(set)
}

// eightGPUNodes are n idle 8-GPU nodes of one machine model.
func eightGPUNodes(n int) []*v1.Node {
	var nodes []*v1.Node
	for i := range n {
		nodes = append(nodes, gpuNode(fmt.Sprintf("w%d", i+1), 8, "128", "1024Gi"))
	}
	return nodes
}

// history is what the scheduler has seen: 6-GPU pods three times as often as whole-node 8-GPU
// ones.
func history() []*v1.Pod {
	var pods []*v1.Pod
	for i := range 6 {
		pods = append(pods, gpuPod(fmt.Sprintf("six-%d", i), "", 6, "48", "192Gi"))
	}
	for i := range 2 {
		pods = append(pods, gpuPod(fmt.Sprintf("eight-%d", i), "", 8, "96", "384Gi"))
	}
	return pods
}

// A gang of 2-GPU workers on idle 8-GPU nodes, where 6-GPU pods are frequent and whole-node
// ones pending: one by one, each member keeps the 6-GPU room of the nodes already broken and
// breaks another whole node; the gang, counting its pending members, fills one node.
func TestGangLeavesWholeNodes(t *testing.T) {
	for _, tc := range []struct {
		name      string
		gang      bool // the members form a gang (else each is placed alone)
		wantNodes int  // nodes the members land on
		wantWhole int  // whole 8-GPU nodes left
	}{
		{"gang", true, 1, 3},
		{"the same pods one by one", false, 3, 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e := newGangEnv(t, true, eightGPUNodes(4), nil, history())
			members := e.gang("workers", 4, 4, 2, "16", "64Gi")
			var nodes []string
			if tc.gang {
				var bound bool
				if nodes, bound = e.groupCycle(members, 4, nil); !bound {
					t.Fatalf("gang not bound: %v", nodes)
				}
			} else {
				for _, m := range members {
					m.Spec.SchedulingGroup = nil
				}
				nodes = e.alone(members)
			}
			if got, whole := distinct(nodes), e.wholeNodes(); got != tc.wantNodes || whole != tc.wantWhole {
				t.Errorf("members on %v (%d nodes), %d whole nodes left; want %d nodes, %d whole", nodes, got, whole, tc.wantNodes, tc.wantWhole)
			}
		})
	}
}

// The first member of a gang counts the members still pending: where a pod alone would break
// a whole node to keep a broken node's 6-GPU room, the gang's first member goes where the rest
// can follow it without breaking any.
func TestGangFirstMemberCountsPending(t *testing.T) {
	nodes := eightGPUNodes(3)
	nodes = append(nodes, gpuNode("used", 8, "128", "1024Gi"))
	bound := []*v1.Pod{gpuPod("running", "used", 2, "16", "64Gi")}
	for _, tc := range []struct {
		name    string
		members int
		want    string
	}{
		{"two members pending", 3, "used"},
		{"none pending: as a pod alone", 1, "w1"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e := newGangEnv(t, true, nodes, bound, history())
			members := e.gang("workers", tc.members, 1, 2, "16", "64Gi")
			e.sync()
			state := framework.NewCycleState()
			state.SetPodGroupSchedulingCycle(framework.NewCycleState())
			if got := e.best(state, members[0]); got != tc.want {
				t.Errorf("first member on %s, want %s", got, tc.want)
			}
			lone := gpuPod("lone", "", 2, "16", "64Gi")
			if got := e.best(framework.NewCycleState(), lone); got != "w1" {
				t.Errorf("a pod alone on %s, want w1 (a whole node, keeping used's 6-GPU room)", got)
			}
		})
	}
}

// Pods outside any gang score exactly as before, with the gate on and off; with the gate off
// there are no groups, so a gang's pods score as pods alone.
func TestGangGateOffAndNonGangPodsUnchanged(t *testing.T) {
	nodes := append(eightGPUNodes(3), gpuNode("used", 8, "128", "1024Gi"))
	bound := []*v1.Pod{gpuPod("running", "used", 2, "16", "64Gi")}
	scoresOf := func(e *gangEnv, pod *v1.Pod, state *framework.CycleState) string {
		e.sync()
		all, _ := e.snapshot.NodeInfos().List()
		var got []string
		if s := e.p.PreScore(context.Background(), state, pod, all); !s.IsSuccess() {
			t.Fatalf("PreScore: %v", s)
		}
		for _, n := range all {
			if n.Node() == nil || !fits(pod, n) {
				continue
			}
			score, _ := e.p.Score(context.Background(), state, pod, n)
			got = append(got, fmt.Sprintf("%s=%d", n.Node().Name, score))
		}
		slices.Sort(got)
		return fmt.Sprint(got)
	}
	// The reference: the model as it was, without any gang code on the path (no follow, no
	// known demand), from the same fleet.
	reference := func(e *gangEnv, pod *v1.Pod) string {
		all, _ := e.snapshot.NodeInfos().List()
		m := e.p.fleet.Model(e.p.learner.Classes(e.p.config.maxClasses, e.p.fleet.Priors(), e.p.config.priorWeight))
		var got []string
		for _, n := range all {
			if n.Node() == nil || !fits(pod, n) {
				continue
			}
			got = append(got, fmt.Sprintf("%s=%d", n.Node().Name, int64(m.Cost(e.p.Free(n), e.p.PodAmounts(pod))*costScale+0.5)))
		}
		slices.Sort(got)
		return fmt.Sprint(got)
	}
	for _, gate := range []bool{true, false} {
		t.Run(fmt.Sprintf("GenericWorkload=%v", gate), func(t *testing.T) {
			e := newGangEnv(t, gate, nodes, bound, history())
			members := e.gang("workers", 3, 3, 2, "16", "64Gi")
			lone := gpuPod("lone", "", 2, "16", "64Gi")
			if got, want := scoresOf(e, lone, framework.NewCycleState()), reference(e, lone); got != want {
				t.Errorf("a pod outside any gang scored %s; the model without gangs gives %s", got, want)
			}
			state := framework.NewCycleState()
			state.SetPodGroupSchedulingCycle(framework.NewCycleState())
			got, want := scoresOf(e, members[0], state), reference(e, members[0])
			if gate && got == want {
				t.Errorf("gate on: a gang member scored %s, as a pod alone; want its pending members counted", got)
			}
			if !gate && got != want {
				t.Errorf("gate off: a gang member scored %s; want %s, as a pod alone (no groups)", got, want)
			}
		})
	}
}

// A gang larger than the cluster takes: the cycle places what fits in the snapshot, the fleet
// reads nodes meanwhile (their generation moved before the cycle, and the sweep finds them),
// then every placement is undone. The fleet must be the cluster's, as a recount gives, and
// the gang's pods must not count as placed.
func TestGangThatDoesNotFitLeavesModelIntact(t *testing.T) {
	nodes := eightGPUNodes(3 * sweepNodes)
	e := newGangEnv(t, true, nodes, nil, history())
	members := e.gang("big", 4*len(nodes)+2, 4*len(nodes)+2, 2, "16", "64Gi")
	// The fleet reads every node, then the node the probe was placed on.
	e.alone([]*v1.Pod{gpuPod("probe", "", 1, "1", "1Gi")})
	e.sync()
	prescore(t, e.p, gpuPod("probe", "", 1, "1", "1Gi"), e.snapshot)
	// Another scheduler's pods move every node's generation, unannounced: the fleet reads
	// them again only as the sweep comes round, during the gang's cycle.
	for i, n := range nodes {
		if err := e.cache.AddPod(e.logger, gpuPod(fmt.Sprintf("other-%d", i), n.Name, 0, "1", "1Gi")); err != nil {
			t.Fatal(err)
		}
	}
	// The sweep's next nodes are not the one the first member lands on (w1, the first of equal
	// nodes by name): the fleet reads w1 only once the member is on it, marked by Reserve.
	e.sync()
	all, _ := e.snapshot.NodeInfos().List()
	for i, n := range all {
		if n.Node().Name == "w1" {
			e.p.sweep = i + 1
		}
	}
	// check compares the model's supplies with a recount over the snapshot (the gang's
	// placements in it included, in the cycle).
	check := func(when string, state *framework.CycleState) {
		t.Helper()
		all, _ := e.snapshot.NodeInfos().List()
		if s := e.p.PreScore(context.Background(), state, gpuPod("check", "", 1, "1", "1Gi"), all); !s.IsSuccess() {
			t.Fatalf("PreScore: %v", s)
		}
		s, err := readState(state)
		if err != nil {
			t.Fatal(err)
		}
		m := s.model
		var free []Room
		var gpus []int64
		for _, n := range all {
			if n.Node() != nil {
				free = append(free, e.p.Free(n))
				alloc := e.p.res.room(n.GetAllocatable())
				gpus = append(gpus, alloc.TotalGPUs())
			}
		}
		if want := NewModel(m.Classes, free, gpus); fmt.Sprint(m.Supply) != fmt.Sprint(want.Supply) {
			t.Fatalf("%s: supply %v; a recount over the snapshot gives %v", when, m.Supply, want.Supply)
		}
	}
	cycles := 0
	placed, bound := e.groupCycle(members, len(members), func() {
		if cycles++; cycles%5 == 0 {
			state := framework.NewCycleState()
			state.SetPodGroupSchedulingCycle(framework.NewCycleState())
			check(fmt.Sprintf("in the cycle, %d members placed", cycles), state)
		}
	})
	if bound || distinct(placed) != len(nodes)+1 { // every node, and "" for those left out
		t.Fatalf("placed %v, bound %v; want every node used and the gang not bound", placed, bound)
	}
	if len(e.p.sim.pods) != 0 {
		t.Errorf("%d pods still counted as placed in the snapshot", len(e.p.sim.pods))
	}
	for range len(nodes) / sweepNodes { // let the sweep come round every node
		check("after the cycle", framework.NewCycleState())
	}
}

// BenchmarkGangScore is the plugin's time for one pod (PreFilter, PreScore over the fleet's
// 1,000 realistic nodes, half their GPUs taken, and Score on 256 of them, as kube-scheduler
// scores about 42% of 1,000), alone (pending=0) and as the first member of a gang of 2-GPU
// workers with pending other members still to place. ns/op is per pod; Score's own share is
// score-ns/node.
//
//	cd scheduler && nice -n 19 go test -trimpath -run xxx -bench GangScore -benchtime 200x ./fragmentation
func BenchmarkGangScore(b *testing.B) {
	for _, pending := range []int{0, 7, 63} {
		b.Run(fmt.Sprintf("pending=%d", pending), func(b *testing.B) {
			featuregatetesting.SetFeatureGateDuringTest(b, utilfeature.DefaultFeatureGate, features.GenericWorkload, true)
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			c := newCluster(ctx, b, 1000, true, 11)
			p := newPlugin(b, c.snapshot, Args{})
			c.fill(b, p, 0.5)
			name := "workers"
			c.cache.AddPodGroup(&schedulingv1beta1.PodGroup{
				ObjectMeta: metav1.ObjectMeta{Namespace: metav1.NamespaceDefault, Name: name},
				Spec: schedulingv1beta1.PodGroupSpec{SchedulingPolicy: schedulingv1beta1.PodGroupSchedulingPolicy{
					Gang: &schedulingv1beta1.GangSchedulingPolicy{MinCount: int32(pending + 1)},
				}},
			})
			var first *v1.Pod
			for i := range pending + 1 {
				pod := gpuPod(fmt.Sprintf("worker-%d", i), "", 2, "16", "64Gi")
				pod.Namespace = metav1.NamespaceDefault
				if pending > 0 {
					pod.Spec.SchedulingGroup = &v1.PodSchedulingGroup{PodGroupName: &name}
					c.cache.AddPodGroupMember(pod)
				}
				if first == nil {
					first = pod
				}
			}
			c.sync(b)
			nodes, _ := c.snapshot.NodeInfos().List()
			const scored = 256
			var spent, scoring time.Duration
			var state *framework.CycleState
			for b.Loop() {
				state = framework.NewCycleState()
				state.SetPodGroupSchedulingCycle(framework.NewCycleState())
				start := time.Now()
				beforeScoring(b, p, state, first, c.snapshot)
				mid := time.Now()
				for i := range scored {
					if _, s := p.Score(ctx, state, first, nodes[(i*7919)%len(nodes)]); !s.IsSuccess() {
						b.Fatalf("Score: %v", s)
					}
				}
				scoring += time.Since(mid)
				spent += time.Since(start)
			}
			b.ReportMetric(float64(spent.Nanoseconds())/float64(b.N), "ns/op")
			b.ReportMetric(float64(scoring.Nanoseconds())/float64(b.N*scored), "score-ns/node")
			if s, err := readState(state); err != nil || (pending > 0) != (s.follow != nil) {
				b.Fatalf("pending %d: the gang's followers were not counted (%v)", pending, err)
			}
		})
	}
}
