// Command refdriver is the reference DRA driver of `cargo xtask bench`.
//
// It does what our efa-driver does on a fixture node, in the way a Go DRA
// driver usually does it: the kubeletplugin helper serves kubelet's
// registration and DRA gRPC services and fetches the claims, and the
// resourceslice controller (started by Helper.PublishResources) keeps the
// node's pool in the API server.
//
//   - Devices: the ResourceSlices that `efa-driver discover` printed for the
//     node (a JSON List, --slices), republished under this driver's own name
//     with the same device names, attributes, capacity and shared counters.
//     `cargo xtask bench neuron` gives it `neuron-driver discover`'s slices
//     instead, for the idle cost of a Go driver publishing the same Neuron
//     devices (it prepares only EFAs, and the Neuron bench prepares none
//     through it).
//   - Prepare: for each allocated device, the PCI function is read from sysfs
//     (its uverbs node, its RDMA device), exactly one directory per device as
//     efa-driver does; the claim gets one CDI spec with the uverbs node, the
//     shared rdma_cm node and EFA_RDMA_DEVICES, written atomically (temp file,
//     fsync, rename, fsync of the directory), then the checkpoint is written
//     the same way, before the answer: the durability our driver has.
//   - Unprepare: the spec is removed and the checkpoint rewritten.
//   - Each prepare logs one "prepare timings" line (timing.go), as our
//     driver does, for the bench's split of kubelet's figure.
//
// It has no exclusivity guard, no health service and no device rescans: it is
// the floor a minimal Go driver sets, not a product.
package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"syscall"
	"time"

	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"
	"k8s.io/dynamic-resource-allocation/kubeletplugin"
	"k8s.io/dynamic-resource-allocation/resourceslice"
	"k8s.io/klog/v2"
)

const cdiClass = "efa"

type config struct {
	driverName   string
	nodeName     string
	kubeconfig   string
	slicesFile   string
	sysfsRoot    string
	devRoot      string
	registrarDir string
	pluginsDir   string
	cdiRoot      string
}

func envOr(name, fallback string) string {
	if v := os.Getenv(name); v != "" {
		return v
	}
	return fallback
}

func main() {
	var c config
	flag.StringVar(&c.driverName, "driver-name", "efa-ref.bench.aws-dra.dev", "DRA driver name")
	flag.StringVar(&c.nodeName, "node-name", os.Getenv("NODE_NAME"), "this node")
	flag.StringVar(&c.kubeconfig, "kubeconfig", os.Getenv("KUBECONFIG"), "kubeconfig (empty: in-cluster)")
	flag.StringVar(&c.slicesFile, "slices", "", "JSON List of ResourceSlices (`efa-driver discover` output)")
	flag.StringVar(&c.sysfsRoot, "sysfs-root", "/sys", "sysfs root")
	flag.StringVar(&c.devRoot, "dev-root", "/dev", "host /dev root")
	flag.StringVar(&c.registrarDir, "registrar-dir", envOr("KUBELET_REGISTRAR_DIRECTORY_PATH", kubeletplugin.KubeletRegistryDir), "kubelet plugin registry dir")
	flag.StringVar(&c.pluginsDir, "plugins-dir", envOr("KUBELET_PLUGINS_DIRECTORY_PATH", kubeletplugin.KubeletPluginsDir), "kubelet plugins dir")
	flag.StringVar(&c.cdiRoot, "cdi-root", envOr("CDI_ROOT", "/var/run/cdi"), "CDI spec dir")
	klog.InitFlags(nil)
	flag.Parse()
	if err := run(c); err != nil {
		fmt.Fprintf(os.Stderr, "refdriver: %v\n", err)
		os.Exit(1)
	}
}

func run(c config) error {
	if c.nodeName == "" || c.slicesFile == "" {
		return errors.New("--node-name and --slices are required")
	}
	slices, devices, err := readSlices(c.slicesFile)
	if err != nil {
		return err
	}
	restConfig, err := clientcmd.BuildConfigFromFlags("", c.kubeconfig)
	if err != nil {
		return fmt.Errorf("kubeconfig: %w", err)
	}
	gets := &claimGets{}
	restConfig.Wrap(gets.wrap)
	client, err := kubernetes.NewForConfig(restConfig)
	if err != nil {
		return fmt.Errorf("client: %w", err)
	}
	dataDir := filepath.Join(c.pluginsDir, c.driverName)
	if err := os.MkdirAll(dataDir, 0o750); err != nil {
		return err
	}
	if err := os.MkdirAll(c.cdiRoot, 0o755); err != nil {
		return err
	}
	d := &driver{cfg: c, checkpointPath: filepath.Join(dataDir, "checkpoint.json"), prepared: map[types.UID]string{}, gets: gets}
	if err := d.loadCheckpoint(); err != nil {
		return err
	}

	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	helper, err := kubeletplugin.Start(ctx, d,
		kubeletplugin.DriverName(c.driverName),
		kubeletplugin.KubeClient(client),
		kubeletplugin.NodeName(c.nodeName),
		kubeletplugin.RegistrarDirectoryPath(c.registrarDir),
		kubeletplugin.PluginDataDirectoryPath(dataDir),
		kubeletplugin.HealthService(false),
	)
	if err != nil {
		return fmt.Errorf("starting the kubelet plugin: %w", err)
	}
	defer helper.Stop()
	pools := map[string]resourceslice.Pool{
		c.nodeName: {Slices: slices},
	}
	if err := helper.PublishResources(ctx, resourceslice.DriverResources{Pools: pools}); err != nil {
		return fmt.Errorf("publishing: %w", err)
	}
	klog.InfoS("serving", "driver", c.driverName, "node", c.nodeName, "slices", len(slices), "devices", devices)
	<-ctx.Done()
	return nil
}

// readSlices takes every slice of a JSON List as it is (its devices and
// its shared counters, which partitioned devices consume: the Neuron
// driver's NeuronCores), and counts the devices.
func readSlices(path string) ([]resourceslice.Slice, int, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, 0, err
	}
	var list struct {
		Items []resourceapi.ResourceSlice `json:"items"`
	}
	if err := json.Unmarshal(data, &list); err != nil {
		return nil, 0, fmt.Errorf("%s: %w", path, err)
	}
	var slices []resourceslice.Slice
	devices := 0
	for _, s := range list.Items {
		slice := resourceslice.Slice{SharedCounters: s.Spec.SharedCounters}
		for _, dev := range s.Spec.Devices {
			// Health taints are the drivers' own; a fixture has none.
			dev.Taints = nil
			slice.Devices = append(slice.Devices, dev)
		}
		devices += len(slice.Devices)
		slices = append(slices, slice)
	}
	if devices == 0 {
		return nil, 0, fmt.Errorf("%s lists no devices", path)
	}
	return slices, devices, nil
}

type driver struct {
	cfg            config
	checkpointPath string
	mu             sync.Mutex
	// claim UID -> CDI spec path: what unprepare must remove.
	prepared map[types.UID]string
	gets     *claimGets
}

var _ kubeletplugin.DRAPlugin = &driver{}

func (d *driver) PrepareResourceClaims(ctx context.Context, claims []*resourceapi.ResourceClaim) (map[types.UID]kubeletplugin.PrepareResult, error) {
	called := time.Now()
	defer func() {
		getStart, getEnd := d.gets.last()
		klog.InfoS("prepare timings", "claims", len(claims),
			"get_seconds", getEnd.Sub(getStart).Seconds(),
			"work_seconds", time.Since(called).Seconds(),
			"total_seconds", time.Since(getStart).Seconds())
	}()
	d.mu.Lock()
	defer d.mu.Unlock()
	out := make(map[types.UID]kubeletplugin.PrepareResult, len(claims))
	changed := false
	for _, claim := range claims {
		result, err := d.prepareClaim(claim)
		if err != nil {
			out[claim.UID] = kubeletplugin.PrepareResult{Err: err}
			continue
		}
		out[claim.UID] = result
		changed = true
	}
	if changed {
		if err := d.saveCheckpoint(); err != nil {
			return nil, err
		}
	}
	return out, nil
}

type efaNode struct {
	request, pool, device string
	uverbs, rdma          string
}

func (d *driver) prepareClaim(claim *resourceapi.ResourceClaim) (kubeletplugin.PrepareResult, error) {
	if claim.Status.Allocation == nil {
		return kubeletplugin.PrepareResult{}, fmt.Errorf("claim %s/%s is not allocated", claim.Namespace, claim.Name)
	}
	var nodes []efaNode
	for _, r := range claim.Status.Allocation.Devices.Results {
		if r.Driver != d.cfg.driverName {
			continue
		}
		uverbs, rdma, err := d.readEFA(r.Device)
		if err != nil {
			return kubeletplugin.PrepareResult{}, err
		}
		nodes = append(nodes, efaNode{request: r.Request, pool: r.Pool, device: r.Device, uverbs: uverbs, rdma: rdma})
	}
	names := make([]string, 0, len(nodes))
	for _, n := range nodes {
		names = append(names, n.rdma)
	}
	sort.Strings(names)
	env := "EFA_RDMA_DEVICES=" + strings.Join(names, ",")
	rdmaCM := filepath.Join("infiniband", "rdma_cm")
	_, cmErr := os.Lstat(filepath.Join(d.cfg.devRoot, rdmaCM))

	vendor := "k8s." + d.cfg.driverName
	spec := cdiSpec{Version: "0.6.0", Kind: vendor + "/" + cdiClass}
	var result kubeletplugin.PrepareResult
	for _, n := range nodes {
		edits := cdiEdits{Env: []string{env}, DeviceNodes: []cdiDeviceNode{d.deviceNode(filepath.Join("infiniband", n.uverbs))}}
		if cmErr == nil {
			edits.DeviceNodes = append(edits.DeviceNodes, d.deviceNode(rdmaCM))
		}
		name := string(claim.UID) + "-" + n.device
		spec.Devices = append(spec.Devices, cdiDevice{Name: name, ContainerEdits: edits})
		result.Devices = append(result.Devices, kubeletplugin.Device{
			Requests:     []string{n.request},
			PoolName:     n.pool,
			DeviceName:   n.device,
			CDIDeviceIDs: []string{spec.Kind + "=" + name},
		})
	}
	data, err := json.MarshalIndent(spec, "", "  ")
	if err != nil {
		return kubeletplugin.PrepareResult{}, err
	}
	path := filepath.Join(d.cfg.cdiRoot, fmt.Sprintf("%s-%s_%s.json", vendor, cdiClass, claim.UID))
	if err := writeAtomically(path, data); err != nil {
		return kubeletplugin.PrepareResult{}, err
	}
	d.prepared[claim.UID] = path
	return result, nil
}

func (d *driver) deviceNode(rel string) cdiDeviceNode {
	return cdiDeviceNode{Path: "/dev/" + rel, HostPath: filepath.Join(d.cfg.devRoot, rel)}
}

// readEFA reads one PCI function: efa-DDDD-BB-DD-F is DDDD:BB:DD.F.
func (d *driver) readEFA(device string) (uverbs, rdma string, err error) {
	parts := strings.Split(strings.TrimPrefix(device, "efa-"), "-")
	if !strings.HasPrefix(device, "efa-") || len(parts) != 4 {
		return "", "", fmt.Errorf("device %q is not an EFA device name", device)
	}
	dir := filepath.Join(d.cfg.sysfsRoot, "bus", "pci", "devices", fmt.Sprintf("%s:%s:%s.%s", parts[0], parts[1], parts[2], parts[3]))
	first := func(sub, prefix string) (string, error) {
		entries, err := os.ReadDir(filepath.Join(dir, sub))
		if err != nil {
			return "", fmt.Errorf("EFA %s: %w", device, err)
		}
		for _, e := range entries {
			if strings.HasPrefix(e.Name(), prefix) {
				return e.Name(), nil
			}
		}
		return "", fmt.Errorf("EFA %s has no %s entry under %s", device, prefix, sub)
	}
	if uverbs, err = first("infiniband_verbs", "uverbs"); err != nil {
		return "", "", err
	}
	if rdma, err = first("infiniband", ""); err != nil {
		return "", "", err
	}
	if _, err := os.Lstat(filepath.Join(d.cfg.devRoot, "infiniband", uverbs)); err != nil {
		return "", "", fmt.Errorf("EFA %s: host device node: %w", device, err)
	}
	return uverbs, rdma, nil
}

func (d *driver) UnprepareResourceClaims(ctx context.Context, claims []kubeletplugin.NamespacedObject) (map[types.UID]error, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	out := make(map[types.UID]error, len(claims))
	changed := false
	for _, claim := range claims {
		path, ok := d.prepared[claim.UID]
		if !ok {
			out[claim.UID] = nil
			continue
		}
		if err := os.Remove(path); err != nil && !os.IsNotExist(err) {
			out[claim.UID] = err
			continue
		}
		delete(d.prepared, claim.UID)
		out[claim.UID] = nil
		changed = true
	}
	if changed {
		if err := d.saveCheckpoint(); err != nil {
			return nil, err
		}
	}
	return out, nil
}

func (d *driver) HandleError(ctx context.Context, err error, msg string) {
	klog.FromContext(ctx).Error(err, msg)
}

func (d *driver) WatchHealthStatus(ctx context.Context, reports chan<- kubeletplugin.DeviceHealthReport) error {
	return kubeletplugin.ErrHealthNotSupported
}

func (d *driver) loadCheckpoint() error {
	data, err := os.ReadFile(d.checkpointPath)
	if os.IsNotExist(err) {
		return nil
	}
	if err != nil {
		return err
	}
	return json.Unmarshal(data, &d.prepared)
}

func (d *driver) saveCheckpoint() error {
	data, err := json.Marshal(d.prepared)
	if err != nil {
		return err
	}
	return writeAtomically(d.checkpointPath, data)
}

// writeAtomically: temp file in the same directory, fsync, rename, fsync of
// the directory.
func writeAtomically(path string, data []byte) error {
	dir := filepath.Dir(path)
	tmp, err := os.CreateTemp(dir, "."+filepath.Base(path)+".tmp-*")
	if err != nil {
		return err
	}
	defer os.Remove(tmp.Name())
	if _, err := tmp.Write(data); err != nil {
		tmp.Close()
		return err
	}
	if err := tmp.Sync(); err != nil {
		tmp.Close()
		return err
	}
	if err := tmp.Close(); err != nil {
		return err
	}
	if err := os.Rename(tmp.Name(), path); err != nil {
		return err
	}
	f, err := os.Open(dir)
	if err != nil {
		return err
	}
	defer f.Close()
	return f.Sync()
}

type cdiSpec struct {
	Version string      `json:"cdiVersion"`
	Kind    string      `json:"kind"`
	Devices []cdiDevice `json:"devices"`
}

type cdiDevice struct {
	Name           string   `json:"name"`
	ContainerEdits cdiEdits `json:"containerEdits"`
}

type cdiEdits struct {
	Env         []string        `json:"env,omitempty"`
	DeviceNodes []cdiDeviceNode `json:"deviceNodes,omitempty"`
}

type cdiDeviceNode struct {
	Path     string `json:"path"`
	HostPath string `json:"hostPath,omitempty"`
}
