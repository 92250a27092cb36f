//! What an agent may change outside its own directories, recorded before it starts, compared after it stops and
//! undone: the kernel settings the kubelet sets at start unless `protectKernelDefaults` (`vm.overcommit_memory`,
//! `kernel.panic`, …), the iptables chains it keeps (`KUBE-IPTABLES-HINT`, `KUBE-FIREWALL` and the jumps to it,
//! the `KUBE-KUBELET-CANARY` chains) and the log symlinks it makes in `/var/log/containers`. The undo is a script
//! (`on-exit.sh` in the benchmark's directory) written before any agent starts, so the reaper runs it too if the
//! benchmark dies half-way.

use std::path::Path;
use std::process::{Command, Stdio};

/// The kernel settings the kubelet's container manager sets (`setupKernelTunables`).
const SYSCTLS: [&str; 6] = [
    "vm/overcommit_memory",
    "vm/panic_on_oom",
    "kernel/panic",
    "kernel/panic_on_oops",
    "kernel/keys/root_maxkeys",
    "kernel/keys/root_maxbytes",
];

/// (command, table, chain) of the iptables chains the kubelet creates (`initNetworkUtil` and its canary monitor).
const CHAINS: [(&str, &str, &str); 9] = [
    ("iptables", "mangle", "KUBE-IPTABLES-HINT"),
    ("iptables", "filter", "KUBE-FIREWALL"),
    ("iptables", "mangle", "KUBE-KUBELET-CANARY"),
    ("iptables", "nat", "KUBE-KUBELET-CANARY"),
    ("iptables", "filter", "KUBE-KUBELET-CANARY"),
    ("ip6tables", "mangle", "KUBE-IPTABLES-HINT"),
    ("ip6tables", "mangle", "KUBE-KUBELET-CANARY"),
    ("ip6tables", "nat", "KUBE-KUBELET-CANARY"),
    ("ip6tables", "filter", "KUBE-KUBELET-CANARY"),
];

/// Where the kubelet links every container's log (a fixed path, whatever its `podLogsDir`).
const CONTAINER_LOGS: &str = "/var/log/containers";

fn sysctl(name: &str) -> String {
    std::fs::read_to_string(Path::new("/proc/sys").join(name))
        .map(|v| v.trim().to_owned())
        .unwrap_or_default()
}

fn chain_exists(cmd: &str, table: &str, chain: &str) -> bool {
    Command::new(cmd)
        .args(["-w", "5", "-t", table, "-n", "-L", chain])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success())
}

/// Symlinks in `/var/log/containers` pointing below `dir`.
fn log_links_into(dir: &Path) -> usize {
    std::fs::read_dir(CONTAINER_LOGS)
        .map(|entries| {
            entries
                .flatten()
                .filter(|e| std::fs::read_link(e.path()).is_ok_and(|t| t.starts_with(dir)))
                .count()
        })
        .unwrap_or(0)
}

/// The machine's state before any agent ran.
pub struct HostState {
    sysctls: Vec<(&'static str, String)>,
    /// The chains of [`CHAINS`] that did not exist (the ones an agent may have added).
    absent_chains: Vec<(&'static str, &'static str, &'static str)>,
    container_logs_existed: bool,
}

impl HostState {
    /// Records the state now.
    pub fn record() -> Self {
        Self {
            sysctls: SYSCTLS.iter().map(|s| (*s, sysctl(s))).collect(),
            absent_chains: CHAINS
                .iter()
                .copied()
                .filter(|(cmd, table, chain)| !chain_exists(cmd, table, chain))
                .collect(),
            container_logs_existed: Path::new(CONTAINER_LOGS).exists(),
        }
    }

    /// A shell script that puts back what [`HostState::record`] saw, for agents whose directories are below `dir`.
    pub fn undo_script(&self, dir: &Path) -> String {
        let mut s = String::from(
            "# written by the kubelet benchmark: undo what the agents changed outside its directory\n",
        );
        for (name, value) in &self.sysctls {
            if !value.is_empty() {
                s += &format!("echo {value} > /proc/sys/{name}\n");
            }
        }
        for (cmd, table, chain) in &self.absent_chains {
            if *chain == "KUBE-FIREWALL" {
                for from in ["INPUT", "OUTPUT"] {
                    s += &format!("while {cmd} -w 5 -D {from} -j {chain} 2>/dev/null; do :; done\n");
                }
            }
            s += &format!(
                "{cmd} -w 5 -t {table} -F {chain} 2>/dev/null; {cmd} -w 5 -t {table} -X {chain} 2>/dev/null\n"
            );
        }
        s += &format!(
            "[ -d {CONTAINER_LOGS} ] && find {CONTAINER_LOGS} -maxdepth 1 -type l -lname '{}/*' -delete\n",
            dir.display()
        );
        if !self.container_logs_existed {
            s += &format!("rmdir {CONTAINER_LOGS} 2>/dev/null\n");
        }
        s += "exit 0\n";
        s
    }

    /// What differs from the recorded state now, for agents whose directories are below `dir` (one line each).
    pub fn changes(&self, dir: &Path) -> Vec<String> {
        let mut out = Vec::new();
        for (name, before) in &self.sysctls {
            let now = sysctl(name);
            if &now != before {
                out.push(format!("sysctl {} {before} -> {now}", name.replace('/', ".")));
            }
        }
        for (cmd, table, chain) in &self.absent_chains {
            if chain_exists(cmd, table, chain) {
                out.push(format!("{cmd} chain {table}/{chain}"));
            }
        }
        let links = log_links_into(dir);
        if links > 0 {
            out.push(format!("{links} symlinks in {CONTAINER_LOGS}"));
        }
        if !self.container_logs_existed && Path::new(CONTAINER_LOGS).exists() {
            out.push(format!("directory {CONTAINER_LOGS} created"));
        }
        out
    }
}
