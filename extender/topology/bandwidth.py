"""Bandwidth of the links inside and between nodes, by link class (GB/s, bidirectional per
GPU, the convention NVIDIA quotes: "900 GB/s NVLink 4"). These are facts about hardware;
the cost model (:mod:`extender.cost`) turns them into time."""

#: One NVLink 3 (A100, 12 links = 600 GB/s) or NVLink 4 (H100/H200, 18 links = 900 GB/s)
#: link: 25 GB/s per direction (NVIDIA NVLink page; stas00/ml-engineering network table).
NVLINK4_PER_LINK_GBPS = 50.0
#: NVLink 5 (B200/GB200): 18 links x 100 GB/s = 1.8 TB/s per GPU (NVIDIA NVLink page).
NVLINK5_PER_LINK_GBPS = 100.0
#: PCIe Gen4 x16: ~32 GB/s per direction (stas00 PCIe table; L40S datasheet: 64 GB/s bidir).
PCIE_GEN4_X16_GBPS = 64.0
#: PCIe Gen5 x16: ~63 GB/s per direction (stas00; 55.4 GB/s measured H2D on 8xH200).
PCIE_GEN5_X16_GBPS = 128.0
#: A P2P path through a host bridge or between host bridges of one socket loses the
#: switch's cut-through; we take half the slot rate (assumption, not a measurement).
HOST_BRIDGE_FACTOR = 0.5
#: Across sockets: a GPU's share of UPI 2.0 (~38 GB/s per direction per link, 2-3 links
#: shared by all GPUs of the socket) or xGMI; P2P often bounces through host memory.
SYS_GBPS = 32.0
#: InfiniBand NDR 400 Gb/s = 50 GB/s per direction per NIC, one NIC per GPU (DGX H100).
IB_NDR_GBPS = 100.0
#: RoCE v2 over 400 GbE (ConnectX-7 / BlueField-3 SuperNIC on Spectrum-X): the same 50 GB/s
#: per direction line rate per NIC as NDR; congestion control and ECN cost some of it
#: under load, which this table does not model.
ROCE_400GBE_GBPS = 100.0
