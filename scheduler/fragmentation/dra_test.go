package fragmentation

import (
	"context"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/informers"
	clientsetfake "k8s.io/client-go/kubernetes/fake"
	"k8s.io/dynamic-resource-allocation/deviceclass/extendedresourcecache"
	resourceslicetracker "k8s.io/dynamic-resource-allocation/resourceslice/tracker"
	"k8s.io/dynamic-resource-allocation/structured"
	"k8s.io/klog/v2"
	fwk "k8s.io/kube-scheduler/framework"
	"k8s.io/kubernetes/pkg/scheduler/backend/cache"
	"k8s.io/kubernetes/pkg/scheduler/framework"
	"k8s.io/kubernetes/pkg/scheduler/framework/plugins/dynamicresources"
	frameworkruntime "k8s.io/kubernetes/pkg/scheduler/framework/runtime"
	"k8s.io/kubernetes/pkg/scheduler/metrics"
	"k8s.io/kubernetes/pkg/scheduler/util/assumecache"
)

// draEnv is a cluster whose GPUs are DRA devices: kube-scheduler's cache and snapshot, a fake
// API server's informers, and kube-scheduler's own DRA manager (claim tracker, slice tracker,
// extended-resource cache) on them, as the scheduler wires them. The plugin hears of slices and
// claims through the informers. What it leaves out: the DynamicResources plugin (the test
// allocates devices itself, as its PreBind would write them) and the binding API calls.
type draEnv struct {
	t        *testing.T
	ctx      context.Context
	client   *clientsetfake.Clientset
	manager  *dynamicresources.DefaultDRAManager
	cache    cache.Cache
	snapshot *cache.Snapshot
	logger   klog.Logger
	p        *Plugin
	seq      int
	// opts give another plugin the same informers and DRA manager (claimbinpack_test.go).
	opts []frameworkruntime.Option
}

func newDRAEnv(t *testing.T, nodes []*v1.Node, objs ...runtime.Object) *draEnv {
	t.Helper()
	metrics.Register()
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	logger := klog.FromContext(ctx)
	client := clientsetfake.NewClientset(objs...)
	factory := informers.NewSharedInformerFactory(client, 0)
	tracker, err := resourceslicetracker.StartTracker(ctx, resourceslicetracker.Options{
		SliceInformer: factory.Resource().V1().ResourceSlices(),
		KubeClient:    client,
	})
	if err != nil {
		t.Fatal(err)
	}
	claims := assumecache.NewAssumeCache(logger, factory.Resource().V1().ResourceClaims().Informer(), "resource claim", "", nil)
	manager := dynamicresources.NewDRAManager(ctx, claims, tracker, factory)
	resolver := manager.DeviceClassResolver().(*extendedresourcecache.ExtendedResourceCache)
	if _, err := factory.Resource().V1().DeviceClasses().Informer().AddEventHandler(resolver); err != nil {
		t.Fatal(err)
	}
	e := &draEnv{t: t, ctx: ctx, client: client, manager: manager, cache: cache.New(ctx, nil, false, false), snapshot: cache.NewEmptySnapshot(), logger: logger}
	for _, n := range nodes {
		e.cache.AddNode(logger, n)
	}
	e.sync()
	e.opts = []frameworkruntime.Option{frameworkruntime.WithInformerFactory(factory), frameworkruntime.WithSharedDRAManager(manager), frameworkruntime.WithSnapshotSharedLister(e.snapshot)}
	e.p = newPlugin(t, e.snapshot, Args{}, e.opts...)
	factory.Start(ctx.Done())
	factory.WaitForCacheSync(ctx.Done())
	var slices int
	for _, o := range objs {
		if _, ok := o.(*resourceapi.ResourceSlice); ok {
			slices++
		}
	}
	e.until("the plugin has every slice", func() bool {
		e.p.dra.mu.Lock()
		defer e.p.dra.mu.Unlock()
		return len(e.p.dra.slices) == slices
	})
	return e
}

func (e *draEnv) sync() {
	e.t.Helper()
	if err := e.cache.UpdateSnapshot(e.logger, e.snapshot); err != nil {
		e.t.Fatal(err)
	}
}

func (e *draEnv) until(what string, cond func() bool) {
	e.t.Helper()
	for deadline := time.Now().Add(10 * time.Second); !cond(); time.Sleep(5 * time.Millisecond) {
		if time.Now().After(deadline) {
			e.t.Fatalf("timed out waiting until %s", what)
		}
	}
}

// draNode is a node that advertises no GPU in its allocatable: its GPUs are devices.
func draNode(name string) *v1.Node {
	return node(name, map[v1.ResourceName]string{v1.ResourceCPU: "128", v1.ResourceMemory: "1024Gi"})
}

func attrs(kv ...string) map[resourceapi.QualifiedName]resourceapi.DeviceAttribute {
	out := map[resourceapi.QualifiedName]resourceapi.DeviceAttribute{}
	for i := 0; i < len(kv); i += 2 {
		out[resourceapi.QualifiedName(kv[i])] = resourceapi.DeviceAttribute{StringValue: &kv[i+1]}
	}
	return out
}

// gpuSlice is the driver's slice of node: gpus whole GPUs (gpu-0...) and, per MIG profile, that
// many MIG devices.
func gpuSlice(nodeName string, gpus int, mig map[string]int) *resourceapi.ResourceSlice {
	var devices []resourceapi.Device
	for i := range gpus {
		devices = append(devices, resourceapi.Device{Name: fmt.Sprintf("gpu-%d", i), Attributes: attrs("type", "gpu", "productName", "NVIDIA H100 80GB HBM3")})
	}
	profiles := make([]string, 0, len(mig))
	for p := range mig {
		profiles = append(profiles, p)
	}
	slices.Sort(profiles)
	for _, p := range profiles {
		for i := range mig[p] {
			// A device name is a DNS label: no dots (1g.10gb -> mig-1g-10gb-0), as the driver names them.
			devices = append(devices, resourceapi.Device{Name: fmt.Sprintf("mig-%s-%d", strings.ReplaceAll(p, ".", "-"), i), Attributes: attrs("type", "mig", "profile", p)})
		}
	}
	return &resourceapi.ResourceSlice{
		ObjectMeta: metav1.ObjectMeta{Name: nodeName + "-gpu.nvidia.com"},
		Spec: resourceapi.ResourceSliceSpec{
			Driver: DRADriver, NodeName: &nodeName, Devices: devices,
			Pool: resourceapi.ResourcePool{Name: nodeName, Generation: 1, ResourceSliceCount: 1},
		},
	}
}

func deviceClass(name, extendedResource string) *resourceapi.DeviceClass {
	c := &resourceapi.DeviceClass{ObjectMeta: metav1.ObjectMeta{Name: name}}
	if extendedResource != "" {
		c.Spec.ExtendedResourceName = &extendedResource
	}
	return c
}

// claimPod is a pending pod with one ResourceClaim of count devices of class (with a CEL
// selector, if given), created in the API.
func (e *draEnv) claimPod(name, class string, count int64, selector string) *v1.Pod {
	e.t.Helper()
	claim := &resourceapi.ResourceClaim{
		ObjectMeta: metav1.ObjectMeta{Namespace: metav1.NamespaceDefault, Name: name + "-gpu"},
		Spec: resourceapi.ResourceClaimSpec{Devices: resourceapi.DeviceClaim{Requests: []resourceapi.DeviceRequest{{
			Name: "gpu", Exactly: &resourceapi.ExactDeviceRequest{DeviceClassName: class, AllocationMode: resourceapi.DeviceAllocationModeExactCount, Count: count},
		}}}},
	}
	if selector != "" {
		claim.Spec.Devices.Requests[0].Exactly.Selectors = []resourceapi.DeviceSelector{{CEL: &resourceapi.CELDeviceSelector{Expression: selector}}}
	}
	claim.ResourceVersion = "1" // the assume cache orders versions; the fake API server sets none
	if _, err := e.client.ResourceV1().ResourceClaims(claim.Namespace).Create(e.ctx, claim, metav1.CreateOptions{}); err != nil {
		e.t.Fatal(err)
	}
	e.until("the tracker has claim "+claim.Name, func() bool {
		_, err := e.manager.ResourceClaims().Get(claim.Namespace, claim.Name)
		return err == nil
	})
	pod := podOn(name, "", map[v1.ResourceName]string{v1.ResourceCPU: "4", v1.ResourceMemory: "16Gi"})
	pod.Namespace = metav1.NamespaceDefault
	pod.Spec.ResourceClaims = []v1.PodResourceClaim{{Name: "gpu", ResourceClaimName: &claim.Name}}
	return pod
}

// allocate gives the pod's claim devices of node, as DynamicResources would, and binds the pod
// there; it waits until the tracker and the plugin have heard of it.
func (e *draEnv) allocate(pod *v1.Pod, nodeName string, devices ...string) {
	e.t.Helper()
	name := *pod.Spec.ResourceClaims[0].ResourceClaimName
	claim, err := e.client.ResourceV1().ResourceClaims(pod.Namespace).Get(e.ctx, name, metav1.GetOptions{})
	if err != nil {
		e.t.Fatal(err)
	}
	var results []resourceapi.DeviceRequestAllocationResult
	for _, d := range devices {
		results = append(results, resourceapi.DeviceRequestAllocationResult{Request: "gpu", Driver: DRADriver, Pool: nodeName, Device: d})
	}
	claim.Status.Allocation = &resourceapi.AllocationResult{Devices: resourceapi.DeviceAllocationResult{Results: results}}
	claim.Status.ReservedFor = []resourceapi.ResourceClaimConsumerReference{{Resource: "pods", Name: pod.Name, UID: pod.UID}}
	e.updateClaim(claim)
	bound := pod.DeepCopy()
	bound.Spec.NodeName = nodeName
	if err := e.cache.AddPod(e.logger, bound); err != nil {
		e.t.Fatal(err)
	}
	e.sync()
}

// updateClaim writes the claim's status and waits until the tracker and the plugin have it.
func (e *draEnv) updateClaim(claim *resourceapi.ResourceClaim) {
	e.t.Helper()
	v, err := strconv.Atoi(claim.ResourceVersion)
	if err != nil {
		e.t.Fatal(err)
	}
	claim.ResourceVersion = strconv.Itoa(v + 1)
	if _, err := e.client.ResourceV1().ResourceClaims(claim.Namespace).UpdateStatus(e.ctx, claim, metav1.UpdateOptions{}); err != nil {
		e.t.Fatal(err)
	}
	var want []structured.DeviceID
	if claim.Status.Allocation != nil {
		for _, r := range claim.Status.Allocation.Devices.Results {
			want = append(want, structured.MakeDeviceID(r.Driver, r.Pool, r.Device))
		}
	}
	e.until("the tracker has claim "+claim.Name+"'s allocation", func() bool {
		got, err := e.manager.ResourceClaims().Get(claim.Namespace, claim.Name)
		if err != nil || (got.Status.Allocation == nil) != (claim.Status.Allocation == nil) {
			return false
		}
		all, err := e.manager.ResourceClaims().ListAllAllocatedDevices()
		return err == nil && all.HasAll(want...)
	})
}

// best runs PreScore over every node, Score and NormalizeScore over the candidates (the nodes
// the DRA allocator would find devices on), and returns the best one.
func (e *draEnv) best(pod *v1.Pod, candidates ...string) string {
	e.t.Helper()
	all, err := e.snapshot.NodeInfos().List()
	if err != nil {
		e.t.Fatal(err)
	}
	state := framework.NewCycleState()
	if _, s := e.p.PreFilter(e.ctx, state, pod, all); !s.IsSuccess() && !s.IsSkip() {
		e.t.Fatalf("PreFilter: %v", s)
	}
	if s := e.p.PreScore(e.ctx, state, pod, all); !s.IsSuccess() {
		e.t.Fatalf("PreScore: %v", s)
	}
	var list fwk.NodeScoreList
	for _, name := range candidates {
		info, err := e.snapshot.NodeInfos().Get(name)
		if err != nil {
			e.t.Fatal(err)
		}
		score, s := e.p.Score(e.ctx, state, pod, info)
		if !s.IsSuccess() {
			e.t.Fatalf("Score(%s): %v", name, s)
		}
		list = append(list, fwk.NodeScore{Name: name, Score: score})
	}
	if s := e.p.NormalizeScore(e.ctx, state, pod, list); !s.IsSuccess() {
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

// free is the plugin's free room of the node, in whole GPUs of kind k.
func (e *draEnv) free(name string, k Kind) int64 {
	e.t.Helper()
	info, err := e.snapshot.NodeInfos().Get(name)
	if err != nil {
		e.t.Fatal(err)
	}
	return e.p.Free(info).GPUs[k]
}

func TestDRANodesCountTheirDevicesAndClaims(t *testing.T) {
	e := newDRAEnv(t, []*v1.Node{draNode("a"), draNode("b")}, gpuSlice("a", 8, nil), gpuSlice("b", 4, nil), deviceClass(DRAGPUClass, ""))
	unit := e.p.config.unit
	pod := e.claimPod("one", DRAGPUClass, 1, "")
	e.best(pod, "a", "b") // PreScore reads the nodes
	if a, b := e.free("a", 0), e.free("b", 0); a != 8*unit || b != 4*unit {
		t.Fatalf("free GPUs a=%d b=%d units, want 8 and 4 GPUs of %d units", a, b, unit)
	}
	if got := e.p.PodAmounts(pod); got.Kind != 0 || got.GPUs != unit {
		t.Errorf("a claim of 1 gpu.nvidia.com device = %+v, want 1 GPU of the whole kind", got)
	}
	e.allocate(pod, "a", "gpu-0", "gpu-1", "gpu-2")
	e.best(e.claimPod("next", DRAGPUClass, 1, ""), "a", "b")
	if got := e.free("a", 0); got != 5*unit {
		t.Errorf("free on a after 3 devices allocated = %d units, want %d", got, 5*unit)
	}
	// Released without any change to the node (the claim is deallocated after its pod is gone).
	claim, err := e.client.ResourceV1().ResourceClaims(pod.Namespace).Get(e.ctx, "one-gpu", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	claim.Status = resourceapi.ResourceClaimStatus{}
	e.updateClaim(claim)
	e.until("the tracker has released the devices", func() bool {
		all, err := e.manager.ResourceClaims().ListAllAllocatedDevices()
		return err == nil && all.Len() == 0
	})
	e.best(e.claimPod("again", DRAGPUClass, 1, ""), "a", "b")
	if free, _ := e.p.fleet.Free("a"); free.GPUs[0] != 8*unit {
		t.Errorf("the model's free GPUs on a after the claim was released = %d units, want %d", free.GPUs[0], 8*unit)
	}
}

func TestDRAWholeNodePodFindsAWholeNode(t *testing.T) {
	nodes := []*v1.Node{draNode("n1"), draNode("n2"), draNode("n3")}
	e := newDRAEnv(t, nodes, gpuSlice("n1", 8, nil), gpuSlice("n2", 8, nil), gpuSlice("n3", 8, nil), deviceClass(DRAGPUClass, ""))
	// The workload: 1-GPU pods and whole-node 8-GPU pods, seen before.
	for i := range 3 {
		e.p.PreFilter(e.ctx, framework.NewCycleState(), e.claimPod(fmt.Sprintf("seen-one-%d", i), DRAGPUClass, 1, ""), nil)
	}
	e.p.PreFilter(e.ctx, framework.NewCycleState(), e.claimPod("seen-eight", DRAGPUClass, 8, ""), nil)
	used := map[string]int{}
	for i := range 8 {
		pod := e.claimPod(fmt.Sprintf("one-%d", i), DRAGPUClass, 1, "")
		n := e.best(pod, "n1", "n2", "n3")
		e.allocate(pod, n, fmt.Sprintf("gpu-%d", used[n]))
		used[n]++
	}
	if len(used) != 1 {
		t.Fatalf("eight 1-GPU pods went to %v, want one node", used)
	}
	var whole []string
	for _, n := range []string{"n1", "n2", "n3"} {
		if e.free(n, 0) == 8*e.p.config.unit {
			whole = append(whole, n)
		}
	}
	if len(whole) != 2 {
		t.Fatalf("whole nodes left: %v, want 2", whole)
	}
	eight := e.claimPod("eight", DRAGPUClass, 8, "")
	if got := e.p.PodAmounts(eight); got.GPUs != 8*e.p.config.unit {
		t.Errorf("an 8-device claim = %+v, want 8 GPUs", got)
	}
}

func TestDRAMIGDevices(t *testing.T) {
	mig := map[string]int{"1g.10gb": 7}
	e := newDRAEnv(t, []*v1.Node{draNode("m1"), draNode("m2"), draNode("big")},
		gpuSlice("m1", 0, mig), gpuSlice("m2", 0, mig), gpuSlice("big", 0, map[string]int{"3g.40gb": 2, "1g.10gb": 1}),
		deviceClass(DRAGPUClass, ""), deviceClass(DRAMIGClass, ""))
	slice1g, units1g, ok := e.p.res.lookup(DefaultMIGResourcePrefix + "1g.10gb")
	if !ok {
		t.Fatal("the 1g.10gb profile of the slices is not a MIG kind")
	}
	slice3g, units3g, _ := e.p.res.lookup(DefaultMIGResourcePrefix + "3g.40gb")
	if units1g != 1 || units3g != 3 {
		t.Fatalf("MIG units 1g=%d 3g=%d, want 1 and 3 of %d", units1g, units3g, e.p.config.unit)
	}
	pod := e.claimPod("small", DRAMIGClass, 1, `device.attributes["gpu.nvidia.com"].profile == "1g.10gb"`)
	if got := e.p.PodAmounts(pod); got.Kind != slice1g || got.GPUs != units1g {
		t.Errorf("a claim of one 1g.10gb device = %+v, want kind %d, %d unit", got, slice1g, units1g)
	}
	if got := e.p.PodAmounts(e.claimPod("large", DRAMIGClass, 2, `device.attributes["gpu.nvidia.com"].profile == "3g.40gb"`)); got.Kind != slice3g || got.GPUs != 2*units3g {
		t.Errorf("a claim of two 3g.40gb devices = %+v, want kind %d, %d units", got, slice3g, 2*units3g)
	}
	// Without a selector the allocator may give any profile: the smallest counts.
	if got := e.p.PodAmounts(e.claimPod("any", DRAMIGClass, 1, "")); got.Kind != slice1g {
		t.Errorf("a MIG claim without a selector = %+v, want the 1g.10gb kind %d", got, slice1g)
	}
	e.allocate(e.claimPod("first", DRAMIGClass, 1, `device.attributes["gpu.nvidia.com"].profile == "1g.10gb"`), "m2", "mig-1g-10gb-0")
	e.p.PreFilter(e.ctx, framework.NewCycleState(), e.claimPod("seen", DRAMIGClass, 7, `device.attributes["gpu.nvidia.com"].profile == "1g.10gb"`), nil)
	// m2 is broken already; m1 still takes a 7-slice pod; big's lone 1g slice is stranded either way.
	if got := e.best(pod, "m1", "m2"); got != "m2" {
		t.Errorf("a 1g.10gb pod went to %s, want m2, the MIG GPU already in use", got)
	}
	if got := e.free("m2", slice1g); got != 6*units1g {
		t.Errorf("free 1g.10gb on m2 = %d, want 6", got)
	}
}

func TestDRAMixedClusterAndExtendedResources(t *testing.T) {
	// counted: 8 nvidia.com/gpu from the device plugin; dra: 8 DRA GPUs, and gpu.nvidia.com maps
	// nvidia.com/gpu (DRAExtendedResource), so a pod asking for nvidia.com/gpu fits either.
	nodes := []*v1.Node{gpuNode("counted", 8, "128", "1024Gi"), draNode("dra")}
	e := newDRAEnv(t, nodes, gpuSlice("dra", 8, nil), deviceClass(DRAGPUClass, DefaultGPUResource))
	unit := e.p.config.unit
	e.until("the DRA manager maps nvidia.com/gpu", func() bool {
		return e.manager.DeviceClassResolver().GetDeviceClass(DefaultGPUResource) != nil
	})
	e.p.PreFilter(e.ctx, framework.NewCycleState(), gpuPod("seen-eight", "", 8, "64", "256Gi"), nil)
	for i := range 3 {
		e.p.PreFilter(e.ctx, framework.NewCycleState(), gpuPod(fmt.Sprintf("seen-one-%d", i), "", 1, "4", "16Gi"), nil)
	}

	// A pod on the DRA node through the extended resource: its request is in the NodeInfo, its
	// devices in the claim DynamicResources made for it; counted once.
	ext := e.claimPod("ext", DRAGPUClass, 2, "")
	ext.Spec.Containers[0].Resources.Requests[DefaultGPUResource] = resource.MustParse("2")
	ext.Spec.ResourceClaims = nil
	claimName := "ext-gpu"
	ext.Spec.ResourceClaims = []v1.PodResourceClaim{{Name: "gpu", ResourceClaimName: &claimName}}
	e.allocate(ext, "dra", "gpu-0", "gpu-1")
	one := gpuPod("one", "", 1, "4", "16Gi")
	if got := e.best(one, "counted", "dra"); got != "dra" {
		t.Errorf("a 1-GPU pod went to %s, want dra, the node in use", got)
	}
	if got := e.free("dra", 0); got != 6*unit {
		t.Errorf("free on dra = %d units, want %d (8 devices less the 2 of the claim, the request not counted again)", got, 6*unit)
	}
	if got := e.free("counted", 0); got != 8*unit {
		t.Errorf("free on counted = %d units, want %d", got, 8*unit)
	}

	// The counted node in use instead: the pod goes there.
	counted := gpuPod("counted-four", "counted", 4, "16", "64Gi")
	if err := e.cache.AddPod(e.logger, counted); err != nil {
		t.Fatal(err)
	}
	claim, err := e.client.ResourceV1().ResourceClaims(metav1.NamespaceDefault).Get(e.ctx, claimName, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	claim.Status = resourceapi.ResourceClaimStatus{}
	e.updateClaim(claim)
	if err := e.cache.RemovePod(e.logger, withNode(ext, "dra")); err != nil {
		t.Fatal(err)
	}
	e.sync()
	if got := e.best(gpuPod("two", "", 1, "4", "16Gi"), "counted", "dra"); got != "counted" {
		t.Errorf("a 1-GPU pod went to %s, want counted, the node in use", got)
	}

	// The class's implicit name asks for the same GPUs.
	implicit := podOn("implicit", "", map[v1.ResourceName]string{
		v1.ResourceCPU: "4", v1.ResourceMemory: "16Gi", v1.ResourceName(resourceapi.ResourceDeviceClassPrefix + DRAGPUClass): "2",
	})
	if got := e.p.PodAmounts(implicit); got.Kind != 0 || got.GPUs != 2*unit {
		t.Errorf("2 of %s%s = %+v, want 2 GPUs of the whole kind", resourceapi.ResourceDeviceClassPrefix, DRAGPUClass, got)
	}
}

func withNode(pod *v1.Pod, nodeName string) *v1.Pod {
	p := pod.DeepCopy()
	p.Spec.NodeName = nodeName
	return p
}
