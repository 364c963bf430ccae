// Command gpuallocator-oracle answers device-plugin allocation requests with NVIDIA's own
// go-gpuallocator best-effort policy, for gangslice's conformance test.
//
// It reads one JSON document on stdin:
//
//	{"topologies": {"<name>": {"gpus": [0, 1, ...],
//	                            "pairs": [{"a": 0, "b": 1, "pcie": "PIX", "nvlinks": 2}, ...]}},
//	 "nvml": {"<name>": {"gpus": [{"uuid": "GPU-...", "busId": "00000000:18:00.0",
//	                                "nvlinks": [{"enabled": true, "remoteBusId": "..."}, ...]}, ...],
//	                      "ancestors": [{"a": 0, "b": 1, "level": 40}, ...]}},
//	 "requests": [{"topology": "<name>", "available": [3, 1, 2], "required": [], "size": 2}, ...]}
//
// A "topologies" entry describes each pair's links as go-gpuallocator's Device.Links hold
// them (one PCIe link, then one NVLink entry when there are NVLinks, as NewDevices appends
// them) and the devices are built directly. An "nvml" entry describes what NVML answers
// instead (the calls go-gpuallocator makes: device count, UUID, PCI info, common ancestor,
// NVLink state and remote PCI info per link), served by go-nvml's mock, and the devices are
// built by go-gpuallocator's own NewDevices, so its link detection is the one used.
//
// It writes, first, one JSON line per "nvml" entry in name order, {"topology": name,
// "pairs": [...]} with the links NewDevices found in the "pairs" form above, then one JSON
// line per request, {"gpus": [...], "padding": N}: the indices of the devices the policy
// returned, in its order, and how many empty padding slots were among them.
package main

import (
	"bufio"
	"encoding/json"
	"fmt"
	"os"
	"reflect"
	"sort"
	"strings"

	"github.com/NVIDIA/go-gpuallocator/gpuallocator"
	"github.com/NVIDIA/go-nvml/pkg/nvml"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock"
)

type pair struct {
	A       int    `json:"a"`
	B       int    `json:"b"`
	PCIe    string `json:"pcie"`
	NVLinks int    `json:"nvlinks"`
}

type topology struct {
	GPUs  []int  `json:"gpus"`
	Pairs []pair `json:"pairs"`
}

type request struct {
	Topology  string `json:"topology"`
	Available []int  `json:"available"`
	Required  []int  `json:"required"`
	Size      int    `json:"size"`
}

type nvlink struct {
	Enabled     bool   `json:"enabled"`
	RemoteBusID string `json:"remoteBusId"`
}

type nvmlGPU struct {
	UUID    string   `json:"uuid"`
	BusID   string   `json:"busId"`
	NVLinks []nvlink `json:"nvlinks"`
}

type ancestor struct {
	A     int `json:"a"`
	B     int `json:"b"`
	Level int `json:"level"`
}

type nvmlTopology struct {
	GPUs      []nvmlGPU  `json:"gpus"`
	Ancestors []ancestor `json:"ancestors"`
}

type input struct {
	Topologies map[string]topology     `json:"topologies"`
	NVML       map[string]nvmlTopology `json:"nvml"`
	Requests   []request               `json:"requests"`
}

type found struct {
	Topology string `json:"topology"`
	Pairs    []pair `json:"pairs"`
}

type answer struct {
	GPUs    []int `json:"gpus"`
	Padding int   `json:"padding"`
}

// The PCIe level names nvidia-smi prints, and the go-gpuallocator link each one is
// (internal/links GetP2PLink; BOARD is NVML's TOPOLOGY_INTERNAL).
var pcieLinkNames = map[string]string{
	"SYS":   "P2PLinkCrossCPU",
	"NODE":  "P2PLinkSameCPU",
	"PHB":   "P2PLinkHostBridge",
	"PXB":   "P2PLinkMultiSwitch",
	"PIX":   "P2PLinkSingleSwitch",
	"BOARD": "P2PLinkSameBoard",
}

// linkTypes reads the link types off go-gpuallocator itself: the P2PLinkType type is in an
// internal package, so its values are found through their String() names.
func linkTypes() (map[string]uint64, []uint64) {
	byName := map[string]uint64{}
	var nvlinks []uint64 // nvlinks[k-1] is the type of k bonded NVLinks
	var probe gpuallocator.P2PLink
	field := reflect.ValueOf(&probe).Elem().FieldByName("Type")
	for v := uint64(0); v < 64; v++ {
		field.SetUint(v)
		name := fmt.Sprint(probe.Type)
		if strings.HasPrefix(name, "UNKNOWN") {
			continue
		}
		byName[name] = v
		if strings.HasSuffix(name, "NVLINKLink") || strings.HasSuffix(name, "NVLINKLinks") {
			nvlinks = append(nvlinks, v)
		}
	}
	return byName, nvlinks
}

func link(peer *gpuallocator.Device, kind uint64) gpuallocator.P2PLink {
	l := gpuallocator.P2PLink{GPU: peer}
	reflect.ValueOf(&l).Elem().FieldByName("Type").SetUint(kind)
	return l
}

func build(t topology, byName map[string]uint64, nvlinkTypes []uint64) (map[int]*gpuallocator.Device, error) {
	devices := map[int]*gpuallocator.Device{}
	for _, i := range t.GPUs {
		d := &gpuallocator.Device{Index: i, Links: map[int][]gpuallocator.P2PLink{}}
		d.UUID = fmt.Sprintf("GPU-oracle-%d", i)
		devices[i] = d
	}
	for _, p := range t.Pairs {
		a, b := devices[p.A], devices[p.B]
		if a == nil || b == nil || p.A == p.B {
			return nil, fmt.Errorf("pair %d-%d names an unknown GPU", p.A, p.B)
		}
		name, ok := pcieLinkNames[p.PCIe]
		if !ok {
			return nil, fmt.Errorf("pair %d-%d: unknown PCIe level %q", p.A, p.B, p.PCIe)
		}
		kinds := []uint64{byName[name]}
		if p.NVLinks > 0 {
			if p.NVLinks > len(nvlinkTypes) {
				return nil, fmt.Errorf("pair %d-%d: %d NVLinks, go-gpuallocator knows at most %d", p.A, p.B, p.NVLinks, len(nvlinkTypes))
			}
			kinds = append(kinds, nvlinkTypes[p.NVLinks-1])
		}
		for _, k := range kinds {
			a.Links[b.Index] = append(a.Links[b.Index], link(b, k))
			b.Links[a.Index] = append(b.Links[a.Index], link(a, k))
		}
	}
	return devices, nil
}

func pciInfo(busID string) nvml.PciInfo {
	var info nvml.PciInfo
	for i := 0; i < len(busID) && i < len(info.BusId)-1; i++ {
		info.BusId[i] = int8(busID[i])
	}
	return info
}

// fromNVML serves t through go-nvml's mock and lets go-gpuallocator's NewDevices build the
// devices from it.
func fromNVML(t nvmlTopology) (map[int]*gpuallocator.Device, error) {
	level := map[[2]int]nvml.GpuTopologyLevel{}
	for _, a := range t.Ancestors {
		level[[2]int{a.A, a.B}] = nvml.GpuTopologyLevel(a.Level)
		level[[2]int{a.B, a.A}] = nvml.GpuTopologyLevel(a.Level)
	}
	byUUID := map[string]int{}
	devices := make([]*mock.Device, len(t.GPUs))
	for i, g := range t.GPUs {
		i, g := i, g
		byUUID[g.UUID] = i
		devices[i] = &mock.Device{
			GetNameFunc:    func() (string, nvml.Return) { return "NVIDIA GPU", nvml.SUCCESS },
			GetUUIDFunc:    func() (string, nvml.Return) { return g.UUID, nvml.SUCCESS },
			GetPciInfoFunc: func() (nvml.PciInfo, nvml.Return) { return pciInfo(g.BusID), nvml.SUCCESS },
			GetTopologyCommonAncestorFunc: func(peer nvml.Device) (nvml.GpuTopologyLevel, nvml.Return) {
				uuid, ret := peer.GetUUID()
				if ret != nvml.SUCCESS {
					return 0, ret
				}
				l, ok := level[[2]int{i, byUUID[uuid]}]
				if !ok {
					return 0, nvml.ERROR_UNKNOWN
				}
				return l, nvml.SUCCESS
			},
			GetNvLinkStateFunc: func(link int) (nvml.EnableState, nvml.Return) {
				if link >= len(g.NVLinks) {
					return 0, nvml.ERROR_INVALID_ARGUMENT
				}
				if g.NVLinks[link].Enabled {
					return nvml.FEATURE_ENABLED, nvml.SUCCESS
				}
				return nvml.FEATURE_DISABLED, nvml.SUCCESS
			},
			GetNvLinkRemotePciInfoFunc: func(link int) (nvml.PciInfo, nvml.Return) {
				if link >= len(g.NVLinks) {
					return nvml.PciInfo{}, nvml.ERROR_INVALID_ARGUMENT
				}
				return pciInfo(g.NVLinks[link].RemoteBusID), nvml.SUCCESS
			},
		}
	}
	lib := &mock.Interface{
		InitFunc:           func() nvml.Return { return nvml.SUCCESS },
		ShutdownFunc:       func() nvml.Return { return nvml.SUCCESS },
		DeviceGetCountFunc: func() (int, nvml.Return) { return len(devices), nvml.SUCCESS },
		DeviceGetHandleByIndexFunc: func(n int) (nvml.Device, nvml.Return) {
			if n < 0 || n >= len(devices) {
				return nil, nvml.ERROR_INVALID_ARGUMENT
			}
			return devices[n], nvml.SUCCESS
		},
	}
	list, err := gpuallocator.NewDevices(gpuallocator.WithNvmlLib(lib))
	if err != nil {
		return nil, err
	}
	out := map[int]*gpuallocator.Device{}
	for _, d := range list {
		out[d.Index] = d
	}
	return out, nil
}

// describe turns the links NewDevices found back into the "pairs" form.
func describe(devices map[int]*gpuallocator.Device, byName map[string]uint64, nvlinkTypes []uint64) ([]pair, error) {
	levelOf := map[uint64]string{}
	for level, name := range pcieLinkNames {
		levelOf[byName[name]] = level
	}
	countOf := map[uint64]int{}
	for k, v := range nvlinkTypes {
		countOf[v] = k + 1
	}
	var indices []int
	for i := range devices {
		indices = append(indices, i)
	}
	sort.Ints(indices)
	var pairs []pair
	for _, a := range indices {
		for _, b := range indices {
			if b <= a {
				continue
			}
			p := pair{A: a, B: b}
			for _, l := range devices[a].Links[b] {
				kind := reflect.ValueOf(l.Type).Uint()
				if level, ok := levelOf[kind]; ok && p.PCIe == "" {
					p.PCIe = level
				} else if n, ok := countOf[kind]; ok && p.NVLinks == 0 {
					p.NVLinks = n
				} else {
					return nil, fmt.Errorf("GPU%d-GPU%d: unexpected link %v among %v", a, b, l.Type, devices[a].Links[b])
				}
			}
			pairs = append(pairs, p)
		}
	}
	return pairs, nil
}

func pick(devices map[int]*gpuallocator.Device, indices []int) ([]*gpuallocator.Device, error) {
	out := []*gpuallocator.Device{}
	for _, i := range indices {
		d := devices[i]
		if d == nil {
			return nil, fmt.Errorf("unknown GPU %d", i)
		}
		out = append(out, d)
	}
	return out, nil
}

func run() error {
	var in input
	dec := json.NewDecoder(bufio.NewReader(os.Stdin))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&in); err != nil {
		return fmt.Errorf("reading the request document: %w", err)
	}
	byName, nvlinkTypes := linkTypes()
	for _, name := range pcieLinkNames {
		if _, ok := byName[name]; !ok {
			return fmt.Errorf("go-gpuallocator has no link type named %s", name)
		}
	}
	graphs := map[string]map[int]*gpuallocator.Device{}
	for name, t := range in.Topologies {
		devices, err := build(t, byName, nvlinkTypes)
		if err != nil {
			return fmt.Errorf("topology %s: %w", name, err)
		}
		graphs[name] = devices
	}
	out := bufio.NewWriter(os.Stdout)
	defer out.Flush()
	enc := json.NewEncoder(out)
	var names []string
	for name := range in.NVML {
		names = append(names, name)
	}
	sort.Strings(names)
	for _, name := range names {
		if _, clash := graphs[name]; clash {
			return fmt.Errorf("%s is both a topology and an nvml entry", name)
		}
		devices, err := fromNVML(in.NVML[name])
		if err != nil {
			return fmt.Errorf("nvml %s: %w", name, err)
		}
		graphs[name] = devices
		pairs, err := describe(devices, byName, nvlinkTypes)
		if err != nil {
			return fmt.Errorf("nvml %s: %w", name, err)
		}
		if err := enc.Encode(found{Topology: name, Pairs: pairs}); err != nil {
			return err
		}
	}
	policy := gpuallocator.NewBestEffortPolicy()
	for n, r := range in.Requests {
		devices, ok := graphs[r.Topology]
		if !ok {
			return fmt.Errorf("request %d: unknown topology %q", n, r.Topology)
		}
		available, err := pick(devices, r.Available)
		if err != nil {
			return fmt.Errorf("request %d available: %w", n, err)
		}
		required, err := pick(devices, r.Required)
		if err != nil {
			return fmt.Errorf("request %d required: %w", n, err)
		}
		got := answer{GPUs: []int{}}
		for _, d := range policy.Allocate(available, required, r.Size) {
			if d == nil {
				got.Padding++
				continue
			}
			got.GPUs = append(got.GPUs, d.Index)
		}
		if err := enc.Encode(got); err != nil {
			return err
		}
	}
	return nil
}

func main() {
	if err := run(); err != nil {
		fmt.Fprintf(os.Stderr, "gpuallocator-oracle: %v\n", err)
		os.Exit(1)
	}
}
