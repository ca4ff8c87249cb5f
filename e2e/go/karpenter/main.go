// Karpenter with its kwok cloud provider, whose instance types also carry
// the DRA devices our drivers publish on them (InstanceType.DynamicResources,
// alpha in Karpenter since v1.14, used when IGNORE_DRA_REQUESTS=false).
//
// The instance types themselves come from kwok's loader (the file named by
// INSTANCE_TYPES_FILE_PATH). AWS_DRA_TEMPLATES_DIR holds one folder per
// instance type, each with the output of `<driver> discover --instance-type
// <type> -o json` of every driver (a List with items, attributeBindings and
// runtimeOnlyAttributes); a type without a folder has no devices. The
// controllers are Karpenter's, wired as its kwok provider needs them.
package main

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"unique"

	resourcev1 "k8s.io/api/resource/v1"
	"sigs.k8s.io/controller-runtime/pkg/log"

	kwok "sigs.k8s.io/karpenter/kwok/cloudprovider"
	"sigs.k8s.io/karpenter/pkg/cloudprovider"
	"sigs.k8s.io/karpenter/pkg/cloudprovider/overlay"
	"sigs.k8s.io/karpenter/pkg/controllers"
	"sigs.k8s.io/karpenter/pkg/controllers/state"
	"sigs.k8s.io/karpenter/pkg/operator"
)

// templateDocument is what `discover --instance-type -o json` prints.
type templateDocument struct {
	Items             []resourcev1.ResourceSlice `json:"items"`
	AttributeBindings []struct {
		Attribute resourcev1.QualifiedName `json:"attribute"`
		Group     string                   `json:"group"`
		Devices   []struct {
			Driver string `json:"driver"`
			Pool   string `json:"pool"`
			Device string `json:"device"`
		} `json:"devices"`
	} `json:"attributeBindings"`
}

// dynamicResources reads every driver's document in dir into one
// DynamicResources. Bindings of the same attribute and group key are
// merged across drivers: both drivers compute the key from one model of
// the instance type, so equal keys are one group on a node (an EFA and
// the chips on its root complex share pcieRoot).
func dynamicResources(dir string) (cloudprovider.DynamicResources, error) {
	var out cloudprovider.DynamicResources
	files, err := filepath.Glob(filepath.Join(dir, "*.json"))
	if err != nil {
		return out, err
	}
	sort.Strings(files)
	type groupKey struct {
		attribute resourcev1.QualifiedName
		group     string
	}
	groups := map[groupKey]*cloudprovider.AttributeBinding{}
	var order []groupKey
	for _, file := range files {
		raw, err := os.ReadFile(file)
		if err != nil {
			return out, err
		}
		var doc templateDocument
		if err := json.Unmarshal(raw, &doc); err != nil {
			return out, fmt.Errorf("%s: %w", file, err)
		}
		for _, slice := range doc.Items {
			out.ResourceSliceTemplates = append(out.ResourceSliceTemplates, sliceTemplates(&slice)...)
		}
		for _, b := range doc.AttributeBindings {
			key := groupKey{b.Attribute, b.Group}
			binding, ok := groups[key]
			if !ok {
				binding = &cloudprovider.AttributeBinding{Attribute: b.Attribute}
				groups[key] = binding
				order = append(order, key)
			}
			for _, d := range b.Devices {
				binding.Devices = append(binding.Devices, cloudprovider.DeviceID{
					Driver: unique.Make(d.Driver),
					Pool:   unique.Make(d.Pool),
					Device: unique.Make(d.Device),
				})
			}
		}
	}
	for _, key := range order {
		// Karpenter ignores bindings of fewer than two devices.
		if len(groups[key].Devices) >= 2 {
			out.AttributeBindings = append(out.AttributeBindings, groups[key])
		}
	}
	return out, nil
}

// sliceTemplates turns one ResourceSlice into Karpenter's templates: the
// devices in one, the counter sets in another (Karpenter's template holds
// either devices or shared counters, never both).
func sliceTemplates(slice *resourcev1.ResourceSlice) []*cloudprovider.ResourceSliceTemplate {
	driver := unique.Make(slice.Spec.Driver)
	pool := cloudprovider.ResourcePool{Name: unique.Make(slice.Spec.Pool.Name)}
	var out []*cloudprovider.ResourceSliceTemplate
	if len(slice.Spec.SharedCounters) > 0 {
		out = append(out, &cloudprovider.ResourceSliceTemplate{Driver: driver, Pool: pool, SharedCounters: slice.Spec.SharedCounters})
	}
	if len(slice.Spec.Devices) > 0 {
		t := &cloudprovider.ResourceSliceTemplate{Driver: driver, Pool: pool}
		for _, d := range slice.Spec.Devices {
			t.Devices = append(t.Devices, cloudprovider.Device{
				Name:                     unique.Make(d.Name),
				Attributes:               d.Attributes,
				Capacity:                 d.Capacity,
				AllowMultipleAllocations: d.AllowMultipleAllocations != nil && *d.AllowMultipleAllocations,
				ConsumesCounters:         d.ConsumesCounters,
			})
		}
		out = append(out, t)
	}
	return out
}

func main() {
	ctx, op := operator.NewOperator()
	instanceTypes, err := kwok.ConstructInstanceTypes(ctx)
	if err != nil {
		log.FromContext(ctx).Error(err, "failed constructing instance types")
		os.Exit(1)
	}
	if dir := os.Getenv("AWS_DRA_TEMPLATES_DIR"); dir != "" {
		for _, it := range instanceTypes {
			typeDir := filepath.Join(dir, it.Name)
			if _, err := os.Stat(typeDir); err != nil {
				continue
			}
			dr, err := dynamicResources(typeDir)
			if err != nil {
				log.FromContext(ctx).Error(err, "reading DRA templates", "instance-type", it.Name)
				os.Exit(1)
			}
			it.DynamicResources = dr
			log.FromContext(ctx).Info("DRA templates attached", "instance-type", it.Name,
				"slices", len(dr.ResourceSliceTemplates), "attribute-bindings", len(dr.AttributeBindings))
		}
	}

	// kwok's provider as is, and behind the NodeOverlay decorator as the
	// controllers expect both.
	bare := kwok.NewCloudProvider(ctx, op.GetClient(), instanceTypes)
	provider := overlay.Decorate(bare, op.GetClient(), op.InstanceTypeStore)
	cluster := state.NewCluster(op.Clock, op.GetClient(), provider)
	op.
		WithControllers(ctx, controllers.NewControllers(
			ctx,
			op.Manager,
			op.Clock,
			op.GetClient(),
			op.EventRecorder,
			provider,
			bare,
			cluster,
			op.InstanceTypeStore,
		)...).Start(ctx)
}
