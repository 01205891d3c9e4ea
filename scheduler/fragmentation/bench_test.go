package fragmentation

import (
	"context"
	"fmt"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
	fwk "k8s.io/kube-scheduler/framework"
	"k8s.io/kubernetes/pkg/scheduler/framework"
)

// BenchmarkPreScore is what the plugin costs per pod before scoring (PreFilter and PreScore)
// on fleets of 1,000 and 15,000 nodes. ns/op is the plugin's own time per pod; classes is the
// size of the model it built.
//
//	cd scheduler && nice -n 19 go test -trimpath -run xxx -bench PreScore -benchtime 2000x ./fragmentation
func BenchmarkPreScore(b *testing.B) {
	steadyState(b, func(b *testing.B, p *Plugin, state fwk.CycleState, pod *v1.Pod, snapshot fwk.SharedLister) time.Duration {
		start := time.Now()
		beforeScoring(b, p, state, pod, snapshot)
		return time.Since(start)
	})
}

// BenchmarkScore is what Score costs per node scored (the scheduler scores a sample of the
// feasible nodes: about 42% of 1,000, 5% of 15,000). ns/op is per node.
func BenchmarkScore(b *testing.B) {
	const scored = 256
	steadyState(b, func(b *testing.B, p *Plugin, state fwk.CycleState, pod *v1.Pod, snapshot fwk.SharedLister) time.Duration {
		beforeScoring(b, p, state, pod, snapshot)
		nodes, _ := snapshot.NodeInfos().List()
		start := time.Now()
		for i := range scored {
			if _, s := p.Score(context.Background(), state, pod, nodes[(i*7919)%len(nodes)]); !s.IsSuccess() {
				b.Fatalf("Score: %v", s)
			}
		}
		return time.Since(start) / scored
	})
}

// steadyState runs timed once per pod on an even and a realistic fleet of 1,000 and 15,000
// nodes, in a steady state: about half the GPUs taken, and between two pods the previous one
// placed and a random one deleted, in kube-scheduler's cache and its snapshot, the plugin
// hearing of both as it would in the scheduler. An even fleet has exact allocatable and no
// system pods; a realistic one reserves cpu, reports memory a few hundred MiB apart from node
// to node, and runs DaemonSet pods on every node. The cache and snapshot updates between pods
// are not counted.
func steadyState(b *testing.B, timed func(*testing.B, *Plugin, fwk.CycleState, *v1.Pod, fwk.SharedLister) time.Duration) {
	for _, fleet := range []struct {
		name    string
		realism bool
	}{{"even", false}, {"realistic", true}} {
		for _, nodes := range []int{1000, 15000} {
			b.Run(fmt.Sprintf("fleet=%s/nodes=%d", fleet.name, nodes), func(b *testing.B) {
				ctx, cancel := context.WithCancel(context.Background())
				defer cancel()
				c := newCluster(ctx, b, nodes, fleet.realism, 11)
				p := newPlugin(b, c.snapshot, Args{})
				c.fill(b, p, 0.5)
				events := notify{p, true}
				var last *v1.Pod
				var state fwk.CycleState
				step := func() time.Duration {
					if last != nil {
						c.bind(events, last, true)
					}
					c.remove(events)
					c.sync(b)
					last = c.pod()
					state = framework.NewCycleState()
					return timed(b, p, state, last, c.snapshot)
				}
				for range 5 { // the first cycle reads every node
					step()
				}
				var spent time.Duration
				for b.Loop() {
					spent += step()
				}
				b.ReportMetric(float64(spent.Nanoseconds())/float64(b.N), "ns/op")
				if s, err := readState(state); err == nil {
					b.ReportMetric(float64(len(s.model.Classes)), "classes")
				}
			})
		}
	}
}

// beforeScoring runs the plugin's extension points before Score: PreFilter (when it has one)
// and PreScore.
func beforeScoring(b *testing.B, p *Plugin, state fwk.CycleState, pod *v1.Pod, snapshot fwk.SharedLister) {
	nodes, err := snapshot.NodeInfos().List()
	if err != nil {
		b.Fatal(err)
	}
	if pf, ok := any(p).(fwk.PreFilterPlugin); ok {
		if _, s := pf.PreFilter(context.Background(), state, pod, nodes); !s.IsSuccess() && !s.IsSkip() {
			b.Fatalf("PreFilter: %v", s)
		}
	}
	if s := p.PreScore(context.Background(), state, pod, nodes); !s.IsSuccess() {
		b.Fatalf("PreScore: %v", s)
	}
}
