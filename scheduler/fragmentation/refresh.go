package fragmentation

import (
	"fmt"
	"sync"

	v1 "k8s.io/api/core/v1"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/tools/cache"
	fwk "k8s.io/kube-scheduler/framework"
)

// How the fleet follows the scheduler's snapshot without reading every node in every cycle. A
// node is read again (its room, its whole-node shape) when it is:
//   - marked by an event: Reserve and Unreserve (this scheduler's placements), the pod
//     informer (pods bound by others, pods that end or are resized) and the node informer
//     (nodes that come, go or change);
//   - in a full pass, when the snapshot's node count and the fleet's disagree (the first
//     cycle, a node event missed or not yet in the snapshot);
//   - among the sweepNodes read each cycle, round robin: a backstop, so that a change no event
//     announced is caught within nodes/sweepNodes cycles. It is small because the events do
//     the work: each node it reads is a cache miss or two on a large fleet (64 a cycle cost
//     more at 15,000 nodes than the rest of PreScore).
//
// It is read only if its NodeInfo generation changed since the fleet last read it. An event
// can reach the plugin before the scheduler's cache has the change, so a marked node whose
// generation has not moved stays marked for up to markedCycles cycles.
const (
	sweepNodes   = 8
	markedCycles = 3
)

// marks are the nodes events have named since the last cycle, with the cycles each has been
// found unchanged. Informer handlers and Unreserve (binding goroutines) mark concurrently with
// the scheduling cycle, hence its own lock.
type marks struct {
	mu    sync.Mutex
	nodes map[string]int
}

func (m *marks) mark(name string) {
	m.mu.Lock()
	m.nodes[name] = 0
	m.mu.Unlock()
}

// keep re-marks a node found unchanged, unless an event marked it again meanwhile.
func (m *marks) keep(name string, cycles int) {
	m.mu.Lock()
	if _, ok := m.nodes[name]; !ok {
		m.nodes[name] = cycles
	}
	m.mu.Unlock()
}

func (m *marks) take() map[string]int {
	m.mu.Lock()
	defer m.mu.Unlock()
	taken := m.nodes
	m.nodes = make(map[string]int, len(taken))
	return taken
}

// watch marks the node of every bound pod's event, and every node's, on the scheduler's own
// informers (the pod informer leaves out ended pods: one that ends is a delete).
func (p *Plugin) watch(f informers.SharedInformerFactory) error {
	pods := f.Core().V1().Pods()
	p.pods = pods.Lister()
	if err := p.watchDRA(f); err != nil {
		return err
	}
	if _, err := pods.Informer().AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc:    p.onPod,
		UpdateFunc: func(_, obj any) { p.onPod(obj) },
		DeleteFunc: p.onPod,
	}); err != nil {
		return err
	}
	_, err := f.Core().V1().Nodes().Informer().AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc:    p.onNode,
		UpdateFunc: func(_, obj any) { p.onNode(obj) },
		DeleteFunc: p.onNode,
	})
	return err
}

func (p *Plugin) onPod(obj any) {
	if d, ok := obj.(cache.DeletedFinalStateUnknown); ok {
		obj = d.Obj
	}
	if pod, ok := obj.(*v1.Pod); ok && pod.Spec.NodeName != "" {
		p.marks.mark(pod.Spec.NodeName)
	}
}

func (p *Plugin) onNode(obj any) {
	if d, ok := obj.(cache.DeletedFinalStateUnknown); ok {
		obj = d.Obj
	}
	if node, ok := obj.(*v1.Node); ok {
		p.marks.mark(node.Name)
	}
}

// refresh brings the fleet up to date with the snapshot (p.mu held).
func (p *Plugin) refresh(lister fwk.NodeInfoLister) error {
	all, err := lister.List()
	if err != nil {
		return fmt.Errorf("listing nodes: %w", err)
	}
	// A node whose DRA room changed is read again whatever its generation: a claim allocated or
	// released leaves the NodeInfo as it was.
	for _, name := range p.refreshDRA() {
		if node, err := lister.Get(name); err == nil {
			p.read(name, node, true)
		}
	}
	for name, cycles := range p.marks.take() {
		node, err := lister.Get(name)
		if err != nil { // gone, or not in the snapshot yet (the count check below finds it)
			p.fleet.Remove(name)
			continue
		}
		if !p.read(name, node, false) && cycles+1 < markedCycles {
			p.marks.keep(name, cycles+1)
		}
	}
	// The snapshot lists a node the fleet lacks, or the other way round (a NodeInfo without its
	// Node, listed by test snapshots, counts as one neither has).
	if len(all)-p.fleet.Len() != p.nodeless {
		p.resync(all)
		p.nodeless = len(all) - p.fleet.Len()
		return nil
	}
	for range min(sweepNodes, len(all)) {
		p.sweep %= len(all)
		node := all[p.sweep]
		p.sweep++
		if n := node.Node(); n != nil {
			p.read(n.Name, node, false)
		}
	}
	return nil
}

// resync reads every node whose generation changed and forgets the nodes the snapshot no
// longer has.
func (p *Plugin) resync(all []fwk.NodeInfo) {
	names := make(map[string]struct{}, len(all))
	for _, node := range all {
		if n := node.Node(); n != nil {
			names[n.Name] = struct{}{}
			p.read(n.Name, node, false)
		}
	}
	if p.fleet.Len() != len(names) {
		for _, name := range p.fleet.Names() {
			if _, ok := names[name]; !ok {
				p.fleet.Remove(name)
			}
		}
	}
}

// read sets the node in the fleet if its generation changed (or force: its DRA room did); it
// reports whether it did.
func (p *Plugin) read(name string, node fwk.NodeInfo, force bool) bool {
	gen := node.GetGeneration()
	if old, ok := p.fleet.Generation(name); ok && old == gen && !force {
		return false
	}
	counted := p.res.room(node.GetAllocatable())
	dra := p.draRoomOf(name)
	alloc := counted.Add(dra.alloc)
	var system Room
	for _, pi := range node.GetPods() {
		if systemPod(pi.GetPod()) {
			system = system.Add(p.res.room(pi.CalculateResource().Resource))
		}
	}
	// The fleet is the cache's cluster: pods a pod group cycle placed in the snapshot only are
	// not in it (gang.go).
	free := nodeFree(counted, p.res.room(node.GetRequested())).Add(dra.free).Add(p.sim.nodes[name])
	p.fleet.Set(name, gen, free, WholeNode(alloc.Sub(system), &p.res.whole), alloc.TotalGPUs())
	return true
}
