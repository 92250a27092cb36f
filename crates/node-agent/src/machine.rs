//! Machine facts: what the node reports as capacity and `nodeInfo`.
//!
//! This module owns [`MachineInfo`], a plain value the agent is handed. In real mode the binary reads it from
//! the host with [`MachineInfo::from_host`] (procfs/sysfs files and a `statvfs` of the agent's root directory);
//! in hollow mode the fleet makes one per node with [`MachineInfo::synthetic`]. The agent core itself never
//! looks at the host.

use std::hash::{Hash, Hasher};
use std::path::Path;
use std::sync::{Arc, LazyLock};

/// Why reading host facts failed.
#[derive(Debug, thiserror::Error)]
pub enum MachineError {
    /// A required host file could not be read.
    #[error("reading {path}: {source}")]
    Read {
        /// The file.
        path: String,
        /// The I/O error.
        #[source]
        source: std::io::Error,
    },
    /// A host file did not have the expected content.
    #[error("parsing {path}: {message}")]
    Parse {
        /// The file.
        path: String,
        /// What was wrong.
        message: String,
    },
}

/// Facts about the machine a node runs on.
///
/// A hollow fleet holds one per node: what is the same on every node (kernel, OS image, OS and architecture
/// names) is one shared copy, and each node's own identifiers are exact-size strings.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MachineInfo {
    /// `/etc/machine-id`.
    pub machine_id: Box<str>,
    /// The SMBIOS product UUID (empty when unreadable).
    pub system_uuid: Box<str>,
    /// `/proc/sys/kernel/random/boot_id`; a change between runs is reported as a reboot.
    pub boot_id: Box<str>,
    /// `uname -r`.
    pub kernel_version: Arc<str>,
    /// `PRETTY_NAME` of `/etc/os-release`.
    pub os_image: Arc<str>,
    /// Go-style OS name (`linux`).
    pub operating_system: &'static str,
    /// Go-style architecture name (`amd64`, `arm64`).
    pub architecture: &'static str,
    /// Logical CPUs, in millicores.
    pub cpu_millis: u64,
    /// Physical memory in bytes.
    pub memory_bytes: u64,
    /// Size of the filesystem holding the agent's root directory, in bytes.
    pub ephemeral_storage_bytes: u64,
    /// Huge pages: (page size in bytes, total bytes of such pages).
    pub hugepages: Vec<(u64, u64)>,
    /// Swap space in bytes (`nodeInfo.swap.capacity`).
    pub swap_bytes: u64,
    /// Extended resources the node advertises (e.g. `nvidia.com/gpu` -> 4); always whole numbers, as the API
    /// requires. A real node learns these from device plugins; a hollow node from its profile.
    pub extended_resources: std::collections::BTreeMap<String, u64>,
}

/// The Go name of this build's CPU architecture.
pub fn go_arch() -> &'static str {
    match std::env::consts::ARCH {
        "x86_64" => "amd64",
        "aarch64" => "arm64",
        "x86" => "386",
        "powerpc64" => "ppc64le",
        "s390x" => "s390x",
        "riscv64" => "riscv64",
        other => other,
    }
}

/// The Go name of this build's OS.
pub fn go_os() -> &'static str {
    std::env::consts::OS
}

fn read(path: &str) -> Result<String, MachineError> {
    std::fs::read_to_string(path).map_err(|source| MachineError::Read {
        path: path.to_owned(),
        source,
    })
}

fn hex_id(seed: &str, salt: u64) -> String {
    let mut out = String::with_capacity(32);
    for half in 0..2u64 {
        let mut h = std::collections::hash_map::DefaultHasher::new();
        (seed, salt, half).hash(&mut h);
        out.push_str(&format!("{:016x}", h.finish()));
    }
    out
}

fn as_uuid(hex: &str) -> String {
    format!(
        "{}-{}-{}-{}-{}",
        &hex[0..8],
        &hex[8..12],
        &hex[12..16],
        &hex[16..20],
        &hex[20..32]
    )
}

impl MachineInfo {
    /// Facts for a simulated node named `node_name`: stable machine ID and system UUID derived from the name, a
    /// boot ID fresh for this process, 4 CPUs, 16 GiB memory, 100 GiB ephemeral storage.
    pub fn synthetic(node_name: &str) -> Self {
        // one copy for every simulated node
        static KERNEL: LazyLock<Arc<str>> = LazyLock::new(|| Arc::from("6.1.0-hollow"));
        static OS_IMAGE: LazyLock<Arc<str>> = LazyLock::new(|| Arc::from("node-agent hollow node"));
        let boot: u128 = rand::random();
        Self {
            system_uuid: as_uuid(&hex_id(node_name, 2)).into(),
            machine_id: hex_id(node_name, 1).into(),
            boot_id: as_uuid(&format!("{boot:032x}")).into(),
            kernel_version: KERNEL.clone(),
            os_image: OS_IMAGE.clone(),
            operating_system: go_os(),
            architecture: go_arch(),
            cpu_millis: 4000,
            memory_bytes: 16 << 30,
            ephemeral_storage_bytes: 100 << 30,
            hugepages: Vec::new(),
            swap_bytes: 0,
            extended_resources: Default::default(),
        }
    }

    /// Reads the facts of this host. `root_dir` is the agent's state directory (its filesystem gives the
    /// ephemeral-storage capacity; the nearest existing ancestor is measured if it does not exist yet).
    pub fn from_host(root_dir: &Path) -> Result<Self, MachineError> {
        let machine_id = read("/etc/machine-id")
            .or_else(|_| read("/var/lib/dbus/machine-id"))
            .map(|s| s.trim().to_owned())
            .unwrap_or_default();
        let system_uuid = read("/sys/class/dmi/id/product_uuid")
            .map(|s| s.trim().to_owned())
            .unwrap_or_default();
        let boot_id = read("/proc/sys/kernel/random/boot_id")?.trim().to_owned();
        let kernel_version = read("/proc/sys/kernel/osrelease")?.trim().to_owned();
        let os_image = read("/etc/os-release")
            .ok()
            .and_then(|text| {
                text.lines()
                    .find_map(|l| l.strip_prefix("PRETTY_NAME="))
                    .map(|v| v.trim_matches('"').to_owned())
            })
            .unwrap_or_else(|| "Linux".into());
        let meminfo = read("/proc/meminfo")?;
        let meminfo_kb = |key: &str| {
            meminfo
                .lines()
                .find_map(|l| l.strip_prefix(key))
                .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
                .map(|kb| kb * 1024)
        };
        let memory_bytes = meminfo_kb("MemTotal:").ok_or_else(|| MachineError::Parse {
            path: "/proc/meminfo".into(),
            message: "no MemTotal line".into(),
        })?;
        let swap_bytes = meminfo_kb("SwapTotal:").unwrap_or(0);
        let cpus = std::thread::available_parallelism()
            .map(|n| n.get() as u64)
            .unwrap_or(1);
        let ephemeral_storage_bytes = fs_size(root_dir)?;
        let hugepages = read_hugepages();
        Ok(Self {
            machine_id: machine_id.into(),
            system_uuid: system_uuid.into(),
            boot_id: boot_id.into(),
            kernel_version: kernel_version.into(),
            os_image: os_image.into(),
            operating_system: go_os(),
            architecture: go_arch(),
            cpu_millis: cpus * 1000,
            memory_bytes,
            ephemeral_storage_bytes,
            hugepages,
            swap_bytes,
            extended_resources: Default::default(),
        })
    }
}

fn fs_size(dir: &Path) -> Result<u64, MachineError> {
    let mut probe = Some(dir);
    while let Some(p) = probe {
        if p.exists() {
            let st = nix::sys::statvfs::statvfs(p).map_err(|e| MachineError::Read {
                path: p.display().to_string(),
                source: std::io::Error::from(e),
            })?;
            return Ok(st.blocks().saturating_mul(st.fragment_size()));
        }
        probe = p.parent();
    }
    Err(MachineError::Parse {
        path: dir.display().to_string(),
        message: "no existing ancestor directory".into(),
    })
}

fn read_hugepages() -> Vec<(u64, u64)> {
    let mut out = Vec::new();
    let Ok(entries) = std::fs::read_dir("/sys/kernel/mm/hugepages") else {
        return out;
    };
    for entry in entries.flatten() {
        let name = entry.file_name().to_string_lossy().into_owned();
        let Some(kb) = name
            .strip_prefix("hugepages-")
            .and_then(|s| s.strip_suffix("kB"))
            .and_then(|s| s.parse::<u64>().ok())
        else {
            continue;
        };
        let count = std::fs::read_to_string(entry.path().join("nr_hugepages"))
            .ok()
            .and_then(|s| s.trim().parse::<u64>().ok())
            .unwrap_or(0);
        out.push((kb * 1024, count * kb * 1024));
    }
    out.sort_unstable();
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn synthetic_ids_are_stable_per_name() {
        let a = MachineInfo::synthetic("n1");
        let b = MachineInfo::synthetic("n1");
        let c = MachineInfo::synthetic("n2");
        assert_eq!(a.machine_id, b.machine_id);
        assert_eq!(a.system_uuid, b.system_uuid);
        assert_ne!(a.machine_id, c.machine_id);
        assert_ne!(a.boot_id, b.boot_id, "boot id is fresh per start");
        assert_eq!(a.machine_id.len(), 32);
        assert_eq!(a.system_uuid.len(), 36);
    }

    #[test]
    fn host_facts_are_readable_here() {
        let m = MachineInfo::from_host(Path::new("/tmp/does-not-exist/agent")).unwrap();
        assert!(m.cpu_millis >= 1000);
        assert!(m.memory_bytes > 0);
        assert!(m.ephemeral_storage_bytes > 0);
        assert!(!m.boot_id.is_empty());
        assert_eq!(m.operating_system, "linux");
    }
}
