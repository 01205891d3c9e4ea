package fragmentation

import (
	"context"
	"fmt"
	"maps"
	"sync"
	"sync/atomic"

	v1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/client-go/informers"
	resourcelisters "k8s.io/client-go/listers/resource/v1"
	"k8s.io/client-go/tools/cache"
	"k8s.io/dynamic-resource-allocation/cel"
	"k8s.io/dynamic-resource-allocation/resourceclaim"
	"k8s.io/dynamic-resource-allocation/structured"
	"k8s.io/klog/v2"
	fwk "k8s.io/kube-scheduler/framework"
)

// GPUs under Dynamic Resource Allocation (resource.k8s.io/v1).
//
// With NVIDIA's DRA driver a node advertises no GPU count in its allocatable: its GPUs and MIG
// devices are Devices of ResourceSlices (driver gpu.nvidia.com, one pool per node), each with a
// "type" attribute, "gpu" or "mig", and for a MIG device its "profile" (1g.10gb, 3g.40gb, ...).
// Pods ask for them through ResourceClaims (device requests of the DeviceClasses gpu.nvidia.com
// and mig.nvidia.com) or through an extended resource a DeviceClass maps (DRAExtendedResource:
// deviceclass.resource.kubernetes.io/<class>, or the class's spec.extendedResourceName), and
// kube-scheduler's DynamicResources plugin allocates devices to the claims.
// Ref: https://github.com/NVIDIA/k8s-dra-driver-gpu (cmd/gpu-kubelet-plugin/deviceinfo.go)
// Ref: k8s.io/kubernetes@v1.37.2 pkg/scheduler/framework/plugins/dynamicresources
//
// The plugin counts them in the same kinds and units as counted GPUs: a DRA GPU is a GPU of the
// first whole-GPU kind (gpuResources, default nvidia.com/gpu), a MIG device of profile <p> is a
// device of the kind <migResourcePrefix><p> (nvidia.com/mig-1g.10gb), so a cluster of counted
// and DRA nodes is one model with one set of classes. A node's DRA room is its devices less
// those allocated to claims (the DRA manager's claim tracker, allocations in flight included);
// it is read again only when an event names the node: a ResourceSlice of the node, a claim
// whose allocation (old or new) holds one of its devices, or this scheduler's Reserve and
// Unreserve on it.
const (
	// DRADriver is the driver whose node-local ResourceSlices are read.
	DRADriver = "gpu.nvidia.com"
	// DRAGPUClass is the DeviceClass of whole GPUs.
	DRAGPUClass = "gpu.nvidia.com"
	// DRAMIGClass is the DeviceClass of MIG devices.
	DRAMIGClass = "mig.nvidia.com"

	draTypeAttribute    resourceapi.QualifiedName = "type"
	draProfileAttribute resourceapi.QualifiedName = "profile"
)

// draDevice is one GPU device of a slice, as the model counts it.
type draDevice struct {
	id    structured.DeviceID
	kind  Kind
	units int64
}

// draTracker follows the driver's DRA GPUs node by node and reads what a pod's claims and
// DRA-backed extended resources ask for, in the kinds and units of resources. GpuFragmentation
// and GpuClaimBinpack each own one.
type draTracker struct {
	handle fwk.Handle
	config config
	res    *resources
	dra    *draState
	// claimLister reads ResourceClaims where the framework has no DRA manager (nil without an
	// informer factory).
	claimLister resourcelisters.ResourceClaimLister
}

func newDRATracker(handle fwk.Handle, c config, res *resources) *draTracker {
	return &draTracker{handle: handle, config: c, res: res, dra: newDRAState()}
}

// draRoom is a node's DRA GPUs: all of them (alloc) and those no claim holds (free).
type draRoom struct {
	alloc, free Room
}

// draState follows the driver's ResourceSlices and the nodes whose DRA room may have changed.
// Informer handlers write under mu; the rooms are read by Score on many nodes at once, under
// roomsMu.
type draState struct {
	mu         sync.Mutex
	slices     map[string]*resourceapi.ResourceSlice // by name: the driver's node-local slices
	nodeSlices map[string]map[string]struct{}        // node -> slice names
	pools      map[string]string                     // pool -> node
	dirty      map[string]int                        // nodes to read again, cycles found unchanged

	roomsMu  sync.RWMutex
	rooms    map[string]draRoom
	devices  map[structured.DeviceID]draDevice
	profiles map[string]resourceapi.Device // one MIG device per profile seen: what selectors are tried on
	allUnits int64                         // the most whole-GPU units of a node (allocationMode All)
	any      atomic.Bool                   // some node has DRA GPUs

	cel *cel.Cache
}

func newDRAState() *draState {
	return &draState{
		slices:     map[string]*resourceapi.ResourceSlice{},
		nodeSlices: map[string]map[string]struct{}{},
		pools:      map[string]string{},
		dirty:      map[string]int{},
		rooms:      map[string]draRoom{},
		devices:    map[structured.DeviceID]draDevice{},
		profiles:   map[string]resourceapi.Device{},
		cel:        cel.NewCache(64, cel.Features{}),
	}
}

func (d *draState) mark(node string) {
	if node == "" {
		return
	}
	d.mu.Lock()
	d.dirty[node] = 0
	d.mu.Unlock()
}

// watchDRA follows the driver's ResourceSlices and every ResourceClaim on the scheduler's
// informers (kube-scheduler starts both for its DynamicResources plugin).
func (p *draTracker) watchDRA(f informers.SharedInformerFactory) error {
	slices := f.Resource().V1().ResourceSlices()
	if _, err := slices.Informer().AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc:    func(obj any) { p.onSlice(nil, obj) },
		UpdateFunc: p.onSlice,
		DeleteFunc: func(obj any) { p.onSlice(obj, nil) },
	}); err != nil {
		return err
	}
	claims := f.Resource().V1().ResourceClaims()
	p.claimLister = claims.Lister()
	_, err := claims.Informer().AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc:    func(obj any) { p.onClaim(nil, obj) },
		UpdateFunc: p.onClaim,
		DeleteFunc: func(obj any) { p.onClaim(obj, nil) },
	})
	return err
}

func asSlice(obj any) *resourceapi.ResourceSlice {
	if d, ok := obj.(cache.DeletedFinalStateUnknown); ok {
		obj = d.Obj
	}
	s, _ := obj.(*resourceapi.ResourceSlice)
	return s
}

// onSlice keeps the driver's node-local slices and marks their nodes.
func (p *draTracker) onSlice(oldObj, newObj any) {
	d := p.dra
	d.mu.Lock()
	defer d.mu.Unlock()
	if old := asSlice(oldObj); old != nil {
		if prev, ok := d.slices[old.Name]; ok {
			node := *prev.Spec.NodeName
			delete(d.slices, old.Name)
			delete(d.nodeSlices[node], old.Name)
			d.dirty[node] = 0
		}
	}
	s := asSlice(newObj)
	if s == nil || s.Spec.Driver != DRADriver || s.Spec.NodeName == nil || *s.Spec.NodeName == "" {
		return
	}
	node := *s.Spec.NodeName
	d.slices[s.Name] = s
	if d.nodeSlices[node] == nil {
		d.nodeSlices[node] = map[string]struct{}{}
	}
	d.nodeSlices[node][s.Name] = struct{}{}
	d.pools[s.Spec.Pool.Name] = node
	d.dirty[node] = 0
	d.roomsMu.Lock()
	for _, dev := range s.Spec.Devices {
		if t, p := dev.Attributes[draTypeAttribute].StringValue, dev.Attributes[draProfileAttribute].StringValue; t != nil && *t == "mig" && p != nil {
			if _, ok := d.profiles[*p]; !ok {
				d.profiles[*p] = dev
			}
		}
	}
	d.roomsMu.Unlock()
}

// onClaim marks the nodes of the devices a claim's allocation held before and holds now.
func (p *draTracker) onClaim(oldObj, newObj any) {
	d := p.dra
	d.mu.Lock()
	defer d.mu.Unlock()
	for _, obj := range []any{oldObj, newObj} {
		if del, ok := obj.(cache.DeletedFinalStateUnknown); ok {
			obj = del.Obj
		}
		claim, ok := obj.(*resourceapi.ResourceClaim)
		if !ok || claim.Status.Allocation == nil {
			continue
		}
		for _, r := range claim.Status.Allocation.Devices.Results {
			if node, ok := d.pools[r.Pool]; ok && r.Driver == DRADriver {
				d.dirty[node] = 0
			}
		}
	}
}

// nodeDevices are the GPU devices of a node's slices, of each pool's newest generation only
// (d.mu held). A device that is neither a GPU nor a MIG device of a known profile is left out.
func (p *draTracker) nodeDevices(node string) []draDevice {
	d := p.dra
	newest := map[string]int64{}
	for name := range d.nodeSlices[node] {
		s := d.slices[name]
		newest[s.Spec.Pool.Name] = max(newest[s.Spec.Pool.Name], s.Spec.Pool.Generation)
	}
	var out []draDevice
	for name := range d.nodeSlices[node] {
		s := d.slices[name]
		if s.Spec.Pool.Generation != newest[s.Spec.Pool.Name] {
			continue
		}
		for _, dev := range s.Spec.Devices {
			kind, units, _, ok := p.deviceKind(dev)
			if !ok {
				continue
			}
			out = append(out, draDevice{id: structured.MakeDeviceID(s.Spec.Driver, s.Spec.Pool.Name, dev.Name), kind: kind, units: units})
		}
	}
	return out
}

// deviceKind: the device's kind and GPU units, and its MIG profile ("" for a whole GPU).
func (p *draTracker) deviceKind(dev resourceapi.Device) (Kind, int64, string, bool) {
	t := dev.Attributes[draTypeAttribute].StringValue
	if t == nil {
		return 0, 0, "", false
	}
	switch *t {
	case "gpu":
		if len(p.config.gpuResources) == 0 {
			return 0, 0, "", false
		}
		return 0, p.config.unit, "", true // the first whole-GPU resource is kind 0
	case "mig":
		profile := dev.Attributes[draProfileAttribute].StringValue
		if profile == nil || p.config.migPrefix == "" {
			return 0, 0, "", false
		}
		k, units, ok := p.res.lookup(v1.ResourceName(p.config.migPrefix + *profile))
		return k, units, *profile, ok
	}
	return 0, 0, "", false
}

// refreshDRA reads again the DRA room of the nodes events named and returns those whose room
// changed. A node found unchanged stays named for up to markedCycles cycles: the
// claim tracker may hear of an allocation after the plugin does.
func (p *draTracker) refreshDRA() []string {
	d := p.dra
	d.mu.Lock()
	defer d.mu.Unlock()
	if len(d.dirty) == 0 {
		return nil
	}
	allocated, err := p.allocatedDevices()
	if err != nil {
		klog.ErrorS(err, "GpuFragmentation: listing allocated DRA devices; reading the nodes again next cycle")
		return nil
	}
	var changed []string
	d.roomsMu.Lock()
	defer d.roomsMu.Unlock()
	dirty := d.dirty
	d.dirty = make(map[string]int, len(dirty))
	allocChanged := false
	for node, cycles := range dirty {
		devices := p.nodeDevices(node)
		var r draRoom
		for _, dev := range devices {
			r.alloc.GPUs[dev.kind] += dev.units
			if !allocated.Has(dev.id) {
				r.free.GPUs[dev.kind] += dev.units
			}
			d.devices[dev.id] = dev
		}
		old, had := d.rooms[node]
		switch {
		case len(devices) == 0 && had:
			delete(d.rooms, node)
		case len(devices) > 0:
			d.rooms[node] = r
		}
		if old != r {
			changed = append(changed, node)
			allocChanged = allocChanged || old.alloc != r.alloc
		} else if cycles+1 < markedCycles {
			d.dirty[node] = cycles + 1
		}
	}
	if allocChanged {
		d.allUnits = 0
		for _, r := range d.rooms {
			d.allUnits = max(d.allUnits, r.alloc.GPUs[0])
		}
	}
	d.any.Store(len(d.rooms) > 0)
	return changed
}

// allocatedDevices: the devices held by claims, from the DRA manager's tracker (allocations in
// flight included) or, without one, from the claims the informer has.
func (p *draTracker) allocatedDevices() (interface {
	Has(structured.DeviceID) bool
}, error) {
	if p.handle != nil {
		if m := p.handle.SharedDRAManager(); m != nil {
			return m.ResourceClaims().ListAllAllocatedDevices()
		}
	}
	set := map[structured.DeviceID]struct{}{}
	if p.claimLister != nil {
		claims, err := p.claimLister.List(labels.Everything())
		if err != nil {
			return nil, err
		}
		for _, c := range claims {
			if c.Status.Allocation == nil {
				continue
			}
			for _, r := range c.Status.Allocation.Devices.Results {
				set[structured.MakeDeviceID(r.Driver, r.Pool, r.Device)] = struct{}{}
			}
		}
	}
	return deviceSet(set), nil
}

type deviceSet map[structured.DeviceID]struct{}

func (s deviceSet) Has(id structured.DeviceID) bool { _, ok := s[id]; return ok }

// draRoomOf is the node's DRA GPUs (zero for a node without any).
func (p *draTracker) draRoomOf(node string) draRoom {
	d := p.dra
	if !d.any.Load() {
		return draRoom{}
	}
	d.roomsMu.RLock()
	r := d.rooms[node]
	d.roomsMu.RUnlock()
	return r
}

// claimDemand is what the pod's ResourceClaims ask for, in GPU units per kind. A claim already
// allocated asks for the devices it holds; one shared with other pods and allocated asks for
// nothing more. A request lists its device class and count (allocationMode All: the GPUs of the
// largest DRA node); of a prioritized list (firstAvailable), the first choice counts.
func (p *draTracker) claimDemand(pod *v1.Pod) Room {
	var room Room
	if len(pod.Spec.ResourceClaims) == 0 {
		return room
	}
	for i := range pod.Spec.ResourceClaims {
		name, _, err := resourceclaim.Name(pod, &pod.Spec.ResourceClaims[i])
		if err != nil || name == nil {
			continue // not created yet: DynamicResources keeps the pod from scheduling until it is
		}
		claim, err := p.getClaim(pod.Namespace, *name)
		if err != nil {
			continue
		}
		room = room.Add(p.claimRoom(pod, claim))
	}
	return room
}

func (p *draTracker) getClaim(namespace, name string) (*resourceapi.ResourceClaim, error) {
	if p.handle != nil {
		if m := p.handle.SharedDRAManager(); m != nil {
			return m.ResourceClaims().Get(namespace, name)
		}
	}
	if p.claimLister != nil {
		return p.claimLister.ResourceClaims(namespace).Get(name)
	}
	return nil, fmt.Errorf("no ResourceClaim lister")
}

func (p *draTracker) claimRoom(pod *v1.Pod, claim *resourceapi.ResourceClaim) Room {
	var room Room
	if a := claim.Status.Allocation; a != nil {
		for _, ref := range claim.Status.ReservedFor {
			if ref.UID != pod.UID {
				return room // shared: its devices are already counted where they are
			}
		}
		d := p.dra
		d.roomsMu.RLock()
		defer d.roomsMu.RUnlock()
		for _, r := range a.Devices.Results {
			if dev, ok := d.devices[structured.MakeDeviceID(r.Driver, r.Pool, r.Device)]; ok {
				room.GPUs[dev.kind] += dev.units
			}
		}
		return room
	}
	for _, req := range claim.Spec.Devices.Requests {
		var ex *resourceapi.ExactDeviceRequest
		if req.Exactly != nil {
			ex = req.Exactly
		} else if len(req.FirstAvailable) > 0 {
			first := req.FirstAvailable[0]
			ex = &resourceapi.ExactDeviceRequest{DeviceClassName: first.DeviceClassName, Selectors: first.Selectors, AllocationMode: first.AllocationMode, Count: first.Count}
		}
		if ex == nil {
			continue
		}
		k, units, ok := p.classKind(ex.DeviceClassName, ex.Selectors)
		if !ok {
			continue
		}
		switch ex.AllocationMode {
		case resourceapi.DeviceAllocationModeAll:
			if k == 0 && units == p.config.unit {
				p.dra.roomsMu.RLock()
				room.GPUs[k] += p.dra.allUnits
				p.dra.roomsMu.RUnlock()
			}
		default:
			room.GPUs[k] += max(ex.Count, 1) * units
		}
	}
	return room
}

// classKind: the kind and GPU units of one device of the class, with the request's selectors.
// A MIG request is the smallest profile any node offers whose device the selectors accept (the
// allocator may give it any of them); none while no node offers a profile it accepts.
func (p *draTracker) classKind(class string, selectors []resourceapi.DeviceSelector) (Kind, int64, bool) {
	switch class {
	case DRAGPUClass:
		if len(p.config.gpuResources) == 0 {
			return 0, 0, false
		}
		return 0, p.config.unit, true
	case DRAMIGClass:
		d := p.dra
		d.roomsMu.RLock()
		profiles := maps.Clone(d.profiles)
		d.roomsMu.RUnlock()
		var best Kind
		var bestUnits int64
		for _, dev := range profiles {
			if !p.selected(dev, selectors) {
				continue
			}
			if k, units, _, ok := p.deviceKind(dev); ok && (bestUnits == 0 || units < bestUnits) {
				best, bestUnits = k, units
			}
		}
		return best, bestUnits, bestUnits > 0
	}
	return 0, 0, false
}

// selected: every CEL selector accepts the device (an expression that does not compile or
// fails accepts none).
func (p *draTracker) selected(dev resourceapi.Device, selectors []resourceapi.DeviceSelector) bool {
	for _, s := range selectors {
		if s.CEL == nil {
			continue
		}
		compiled := p.dra.cel.GetOrCompile(s.CEL.Expression)
		if compiled.Error != nil {
			return false
		}
		ok, _, err := compiled.DeviceMatches(context.Background(), cel.Device{Driver: DRADriver, Attributes: dev.Attributes, Capacity: dev.Capacity})
		if err != nil || !ok {
			return false
		}
	}
	return true
}

// extendedDemand is what the pod asks for through extended resources that a DeviceClass maps
// (DRAExtendedResource) and that are not counted GPU resources already: the names
// deviceclass.resource.kubernetes.io/<class> and a class's spec.extendedResourceName.
func (p *draTracker) extendedDemand(list v1.ResourceList) Room {
	var room Room
	if p.handle == nil {
		return room
	}
	m := p.handle.SharedDRAManager()
	if m == nil {
		return room
	}
	resolver := m.DeviceClassResolver()
	for name, q := range list {
		if _, _, ok := p.res.lookup(name); ok || !extendedName(string(name)) || q.IsZero() {
			continue
		}
		class := resolver.GetDeviceClass(name)
		if class == nil {
			continue
		}
		var selectors []resourceapi.DeviceSelector
		for _, s := range class.Spec.Selectors {
			if class.Name == DRAMIGClass {
				selectors = append(selectors, s)
			}
		}
		if k, units, ok := p.classKind(class.Name, selectors); ok {
			room.GPUs[k] += q.Value() * units
		}
	}
	return room
}

// nodeFree: allocatable less requested, on the kinds the node advertises in its allocatable
// only: an extended resource a node does not advertise is one DRA provides there
// (DRAExtendedResource), and its devices count in the node's DRA room.
func nodeFree(alloc, requested Room) Room {
	for k, g := range alloc.GPUs {
		if g == 0 {
			requested.GPUs[k] = 0
		}
	}
	return alloc.Sub(requested)
}
