//! Starting, describing, attaching to and stopping one control plane.

use std::net::{IpAddr, Ipv4Addr, TcpStream};
use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use anyhow::{Context, bail};
use k8s_openapi::api::core::v1::{ConfigMap, ServiceAccount};
use kube::config::{KubeConfigOptions, Kubeconfig};
use kube::{Api, Config};
use serde::{Deserialize, Serialize};

#[path = "control_plane_credentials.rs"]
mod credentials;

use crate::assets::{self, Binaries};
use crate::kubeconfig;
use crate::pki::{Ca, CertSpec, Pem};
use crate::ports::{free_port, port_conflict};
use crate::process::{Proc, pid_alive};

/// How to start a control plane. `Default` gives the flags the tests use.
#[derive(Debug, Clone)]
pub struct Options {
    /// Directory for certificates, kubeconfigs, logs and etcd data; a fresh one under the temp dir when `None`.
    pub dir: Option<PathBuf>,
    /// `--node-monitor-grace-period` of the controller-manager (how long until a silent node is NotReady).
    pub node_monitor_grace_period: Option<Duration>,
    /// Extra kube-apiserver flags.
    pub apiserver_args: Vec<String>,
    /// Extra kube-controller-manager flags.
    pub controller_manager_args: Vec<String>,
    /// Extra kube-scheduler flags.
    pub scheduler_args: Vec<String>,
    /// How long to wait for everything to come up.
    pub start_timeout: Duration,
    /// More addresses the API server's serving certificate names, for clients that reach the loopback it
    /// listens on by another address (a VM guest's view of the host, `10.0.2.2` on QEMU's user network).
    pub serving_ips: Vec<IpAddr>,
}

impl Default for Options {
    fn default() -> Self {
        Self {
            dir: None,
            node_monitor_grace_period: None,
            apiserver_args: Vec::new(),
            controller_manager_args: Vec::new(),
            scheduler_args: Vec::new(),
            start_timeout: Duration::from_secs(90),
            serving_ips: Vec::new(),
        }
    }
}

/// What a running control plane looks like from outside; saved as `control-plane.json` in its directory so
/// other processes (`testenv` commands, tests named by `NODE_AGENT_CONTROL_PLANE`) can attach to it.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Info {
    /// `https://127.0.0.1:<port>`.
    pub server: String,
    /// The pinned Kubernetes version.
    pub version: String,
    /// The component binaries.
    pub binaries: Binaries,
    /// PIDs by component name (etcd, kube-apiserver, …), and the launcher's own under `launcher`.
    pub pids: Vec<(String, u32)>,
}

/// A running control plane (started here, or attached to).
#[derive(Debug)]
pub struct ControlPlane {
    dir: PathBuf,
    info: Info,
    procs: Mutex<Vec<Proc>>,
    remove_dir_on_stop: bool,
    /// The kube-apiserver's program and arguments (to start it again after [`ControlPlane::stop_apiserver`]).
    apiserver_cmd: Option<(PathBuf, Vec<String>)>,
    /// etcd's program and arguments, and its client URL (to start it again after [`ControlPlane::stop_etcd`]).
    etcd_cmd: Option<(PathBuf, Vec<String>, String)>,
}

const INFO_FILE: &str = "control-plane.json";

fn write_pem(dir: &Path, name: &str, pem: &Pem) -> anyhow::Result<(PathBuf, PathBuf)> {
    let cert = dir.join(format!("{name}.crt"));
    let key = dir.join(format!("{name}.key"));
    std::fs::write(&cert, &pem.cert)?;
    std::fs::write(&key, &pem.key)?;
    Ok((cert, key))
}

fn fresh_dir() -> anyhow::Result<PathBuf> {
    static COUNTER: AtomicU32 = AtomicU32::new(0);
    let base = std::env::temp_dir().join("node-agent-testenv");
    std::fs::create_dir_all(&base)?;
    // Leftovers of earlier test binaries whose process is gone (their children died with them).
    for entry in std::fs::read_dir(&base)?.flatten() {
        let name = entry.file_name().to_string_lossy().into_owned();
        let owner = name
            .strip_prefix("cp-")
            .and_then(|r| r.split('-').next())
            .and_then(|p| p.parse().ok());
        if let Some(pid) = owner
            && pid != std::process::id()
            && !pid_alive(pid)
        {
            let _ = std::fs::remove_dir_all(entry.path());
        }
    }
    let n = COUNTER.fetch_add(1, Ordering::Relaxed);
    let dir = base.join(format!("cp-{}-{n}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    Ok(dir)
}

async fn wait_tcp(port: u16, deadline: tokio::time::Instant, proc: &mut Proc) -> anyhow::Result<()> {
    loop {
        if TcpStream::connect((Ipv4Addr::LOCALHOST, port)).is_ok() {
            return Ok(());
        }
        proc.check_running()?;
        if tokio::time::Instant::now() >= deadline {
            bail!("{} did not listen on 127.0.0.1:{port} in time", proc.name());
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

impl ControlPlane {
    /// Builds (if needed) and starts etcd, kube-apiserver, kube-controller-manager and kube-scheduler, and waits
    /// until the API server is ready and the controller-manager is working.
    /// A start that loses a port to another process between picking and binding is retried with fresh ports
    /// (three attempts).
    pub async fn start(opts: Options) -> anyhow::Result<Self> {
        let mut attempt = 1;
        loop {
            let dir = match &opts.dir {
                Some(d) => d.clone(),
                None => fresh_dir()?,
            };
            match Self::start_once(&opts, dir.clone()).await {
                Err(e) if attempt < 3 && port_conflict(&e) => {
                    tracing::warn!(attempt, error = %e, "port taken while starting; retrying with other ports");
                    // the failed attempt's processes are gone (dropped); its state must not leak into the next
                    let _ = std::fs::remove_dir_all(if opts.dir.is_some() {
                        dir.join("etcd-data")
                    } else {
                        dir
                    });
                    attempt += 1;
                }
                other => return other,
            }
        }
    }

    async fn start_once(opts: &Options, dir: PathBuf) -> anyhow::Result<Self> {
        let binaries = tokio::task::spawn_blocking(assets::locate).await??;
        let pki = dir.join("pki");
        let logs = dir.join("logs");
        for d in [&pki, &logs] {
            std::fs::create_dir_all(d).with_context(|| d.display().to_string())?;
        }
        let localhost = IpAddr::V4(Ipv4Addr::LOCALHOST);

        // certificates
        let ca = Ca::generate("node-agent-test-ca")?;
        let (ca_crt, ca_key) = write_pem(&pki, "ca", ca.pem())?;
        let serving = ca.issue(&CertSpec {
            common_name: "kube-apiserver".into(),
            ips: [localhost, IpAddr::V4(Ipv4Addr::new(10, 96, 0, 1))]
                .into_iter()
                .chain(opts.serving_ips.iter().copied())
                .collect(),
            dns: [
                "localhost",
                "kubernetes",
                "kubernetes.default",
                "kubernetes.default.svc",
            ]
            .map(String::from)
            .to_vec(),
            server: true,
            ..CertSpec::default()
        })?;
        let (serving_crt, serving_key) = write_pem(&pki, "apiserver", &serving)?;
        let kubelet_client = ca.issue(&CertSpec::client(
            "kube-apiserver-kubelet-client",
            &["system:masters"],
        ))?;
        let (kc_crt, kc_key) = write_pem(&pki, "apiserver-kubelet-client", &kubelet_client)?;
        let sa_key = pki.join("service-account.key");
        let sa_pub = pki.join("service-account.pub");
        let (sa_private_pem, sa_public_pem) = crate::pki::new_signing_key_pem()?;
        std::fs::write(&sa_key, sa_private_pem)?;
        std::fs::write(&sa_pub, sa_public_pem)?;

        let etcd_port = free_port()?;
        let etcd_peer = free_port()?;
        let api_port = free_port()?;
        let kcm_port = free_port()?;
        let sched_port = free_port()?;
        let server = format!("https://127.0.0.1:{api_port}");

        let mut identities = Vec::new();
        for (name, user, groups) in [
            ("admin", "admin", &["system:masters"][..]),
            ("controller-manager", "system:kube-controller-manager", &[][..]),
            ("scheduler", "system:kube-scheduler", &[][..]),
        ] {
            let pem = ca.issue(&CertSpec::client(user, groups))?;
            let (crt, key) = write_pem(&pki, name, &pem)?;
            let kc = dir.join(format!("{name}.kubeconfig"));
            kubeconfig::write(&kc, &server, &ca_crt, &crt, &key, user)?;
            identities.push(kc);
        }
        let [_admin_kc, kcm_kc, sched_kc] = <[PathBuf; 3]>::try_from(identities)
            .map_err(|_| anyhow::anyhow!("three kubeconfigs expected"))?;

        let deadline = tokio::time::Instant::now() + opts.start_timeout;
        let s = |p: &Path| p.display().to_string();
        let mut cp = Self {
            dir: dir.clone(),
            info: Info {
                server: server.clone(),
                version: assets::kubernetes_version().to_owned(),
                binaries: binaries.clone(),
                pids: vec![("launcher".into(), std::process::id())],
            },
            procs: Mutex::new(Vec::new()),
            remove_dir_on_stop: opts.dir.is_none(),
            apiserver_cmd: None,
            etcd_cmd: None,
        };

        // etcd
        let etcd_args = vec![
            format!("--data-dir={}", s(&dir.join("etcd-data"))),
            format!("--listen-client-urls=http://127.0.0.1:{etcd_port}"),
            format!("--advertise-client-urls=http://127.0.0.1:{etcd_port}"),
            format!("--listen-peer-urls=http://127.0.0.1:{etcd_peer}"),
            format!("--initial-advertise-peer-urls=http://127.0.0.1:{etcd_peer}"),
            format!("--initial-cluster=default=http://127.0.0.1:{etcd_peer}"),
            "--log-level=warn".into(),
            "--quota-backend-bytes=8589934592".into(),
        ];
        cp.etcd_cmd = Some((
            binaries.etcd.clone(),
            etcd_args.clone(),
            format!("http://127.0.0.1:{etcd_port}"),
        ));
        let mut etcd = Proc::start("etcd", &binaries.etcd, &etcd_args, &logs.join("etcd.log"))?;
        let etcd_ready = wait_tcp(etcd_port, deadline, &mut etcd).await;
        cp.adopt(etcd);
        etcd_ready?;

        // kube-apiserver
        let mut apiserver_args = vec![
            format!("--etcd-servers=http://127.0.0.1:{etcd_port}"),
            "--bind-address=127.0.0.1".into(),
            "--advertise-address=127.0.0.1".into(),
            format!("--secure-port={api_port}"),
            format!("--tls-cert-file={}", s(&serving_crt)),
            format!("--tls-private-key-file={}", s(&serving_key)),
            format!("--client-ca-file={}", s(&ca_crt)),
            "--service-account-issuer=https://kubernetes.default.svc".into(),
            format!("--service-account-key-file={}", s(&sa_pub)),
            format!("--service-account-signing-key-file={}", s(&sa_key)),
            "--service-cluster-ip-range=10.96.0.0/16".into(),
            "--authorization-mode=Node,RBAC".into(),
            "--enable-admission-plugins=NodeRestriction".into(),
            "--allow-privileged=true".into(),
            format!("--kubelet-client-certificate={}", s(&kc_crt)),
            format!("--kubelet-client-key={}", s(&kc_key)),
            // kubelets' serving certificates are checked against the cluster CA, as a hardened cluster does:
            // a node serves logs only with a certificate from `kubelet_serving_certificate`
            format!("--kubelet-certificate-authority={}", s(&ca_crt)),
            "--kubelet-preferred-address-types=InternalIP".into(),
            // bootstrap tokens (kube-system/bootstrap-token-<id>) authenticate, for TLS bootstrap tests
            "--enable-bootstrap-token-auth".into(),
            "--profiling=false".into(),
        ];
        apiserver_args.extend(opts.apiserver_args.iter().cloned());
        cp.apiserver_cmd = Some((binaries.kube_apiserver.clone(), apiserver_args.clone()));
        let apiserver = Proc::start(
            "kube-apiserver",
            &binaries.kube_apiserver,
            &apiserver_args,
            &logs.join("kube-apiserver.log"),
        )?;
        cp.adopt(apiserver);
        if let Err(e) = cp.wait_apiserver_ready(deadline).await {
            let tail = crate::process::log_tail(&logs.join("kube-apiserver.log"), 30);
            cp.stop_processes().await;
            bail!("kube-apiserver not ready: {e:#}\n{tail}");
        }

        // controller-manager and scheduler
        let mut kcm_args = vec![
            format!("--kubeconfig={}", s(&kcm_kc)),
            format!("--authentication-kubeconfig={}", s(&kcm_kc)),
            format!("--authorization-kubeconfig={}", s(&kcm_kc)),
            "--bind-address=127.0.0.1".into(),
            format!("--secure-port={kcm_port}"),
            format!("--cert-dir={}", s(&dir.join("controller-manager-certs"))),
            format!("--service-account-private-key-file={}", s(&sa_key)),
            format!("--root-ca-file={}", s(&ca_crt)),
            "--use-service-account-credentials=true".into(),
            format!("--cluster-signing-cert-file={}", s(&ca_crt)),
            format!("--cluster-signing-key-file={}", s(&ca_key)),
            "--leader-elect=false".into(),
            "--allocate-node-cidrs=true".into(),
            "--cluster-cidr=10.128.0.0/9".into(),
            "--node-cidr-mask-size=24".into(),
            "--service-cluster-ip-range=10.96.0.0/16".into(),
        ];
        if let Some(grace) = opts.node_monitor_grace_period {
            kcm_args.push(format!("--node-monitor-grace-period={}s", grace.as_secs().max(1)));
            kcm_args.push("--node-monitor-period=1s".into());
        }
        kcm_args.extend(opts.controller_manager_args.iter().cloned());
        let kcm = Proc::start(
            "kube-controller-manager",
            &binaries.kube_controller_manager,
            &kcm_args,
            &logs.join("kube-controller-manager.log"),
        )?;
        cp.adopt(kcm);
        let mut sched_args = vec![
            format!("--kubeconfig={}", s(&sched_kc)),
            format!("--authentication-kubeconfig={}", s(&sched_kc)),
            format!("--authorization-kubeconfig={}", s(&sched_kc)),
            "--bind-address=127.0.0.1".into(),
            format!("--secure-port={sched_port}"),
            "--leader-elect=false".into(),
        ];
        sched_args.extend(opts.scheduler_args.iter().cloned());
        let mut sched = Proc::start(
            "kube-scheduler",
            &binaries.kube_scheduler,
            &sched_args,
            &logs.join("kube-scheduler.log"),
        )?;
        let sched_ready = wait_tcp(sched_port, deadline, &mut sched).await;
        cp.adopt(sched);
        let ready = match sched_ready {
            Ok(()) => cp.wait_controller_manager(deadline).await,
            Err(e) => Err(e),
        };
        if let Err(e) = ready {
            cp.stop_processes().await;
            return Err(e);
        }
        cp.save_info()?;
        tracing::info!(server = %server, dir = %dir.display(), "control plane ready");
        Ok(cp)
    }

    /// Attaches to a control plane started elsewhere (`testenv up --dir DIR`). Stopping an attached control
    /// plane does not stop its processes.
    pub fn attach(dir: &Path) -> anyhow::Result<Self> {
        let path = dir.join(INFO_FILE);
        let text = std::fs::read_to_string(&path).with_context(|| format!("reading {}", path.display()))?;
        let info: Info =
            serde_json::from_str(&text).with_context(|| format!("parsing {}", path.display()))?;
        Ok(Self {
            dir: dir.to_path_buf(),
            info,
            procs: Mutex::new(Vec::new()),
            remove_dir_on_stop: false,
            apiserver_cmd: None,
            etcd_cmd: None,
        })
    }

    /// Stops the kube-apiserver only (SIGTERM, then SIGKILL after 10 s): clients see the API server
    /// unreachable while etcd, the controller-manager and the scheduler keep running. For a control plane this
    /// handle started; an error when it has no kube-apiserver running.
    pub async fn stop_apiserver(&self) -> anyhow::Result<()> {
        let proc = {
            let mut procs = self
                .procs
                .lock()
                .map_err(|_| anyhow::anyhow!("process list lock poisoned"))?;
            let i = procs
                .iter()
                .position(|p| p.name() == "kube-apiserver")
                .context("no kube-apiserver started by this handle is running")?;
            procs.remove(i)
        };
        proc.stop(Duration::from_secs(10)).await
    }

    /// Starts the kube-apiserver again after [`ControlPlane::stop_apiserver`], on the same port with the same
    /// flags (its data is in etcd), and waits up to 60 s until it is ready. Its new PID is in
    /// [`ControlPlane::pids`], not in [`ControlPlane::info`].
    pub async fn start_apiserver(&self) -> anyhow::Result<()> {
        let (program, args) = self
            .apiserver_cmd
            .clone()
            .context("this handle did not start the control plane")?;
        let running = self
            .procs
            .lock()
            .map(|p| p.iter().any(|p| p.name() == "kube-apiserver"))
            .unwrap_or(false);
        if running {
            bail!("kube-apiserver is running already");
        }
        let log = self.dir.join("logs").join("kube-apiserver.log");
        let proc = Proc::start("kube-apiserver", &program, &args, &log)?;
        if let Ok(mut procs) = self.procs.lock() {
            // after etcd: stopping everything stays in reverse start order
            let at = procs.len().min(1);
            procs.insert(at, proc);
        }
        self.wait_apiserver_ready(tokio::time::Instant::now() + Duration::from_secs(60))
            .await
            .with_context(|| crate::process::log_tail(&log, 30))
    }

    /// Stops etcd only (SIGTERM, then SIGKILL after 10 s): the API server stays up but cannot read or write.
    /// For a control plane this handle started; an error when it has no etcd running.
    pub async fn stop_etcd(&self) -> anyhow::Result<()> {
        let proc = {
            let mut procs = self
                .procs
                .lock()
                .map_err(|_| anyhow::anyhow!("process list lock poisoned"))?;
            let i = procs
                .iter()
                .position(|p| p.name() == "etcd")
                .context("no etcd started by this handle is running")?;
            procs.remove(i)
        };
        proc.stop(Duration::from_secs(10)).await
    }

    /// Starts etcd again after [`ControlPlane::stop_etcd`], on the same ports with the same data, and waits up
    /// to 60 s until the API server is ready again (it reconnects by itself).
    pub async fn start_etcd(&self) -> anyhow::Result<()> {
        let (program, args, _) = self
            .etcd_cmd
            .clone()
            .context("this handle did not start the control plane")?;
        let running = self
            .procs
            .lock()
            .map(|p| p.iter().any(|p| p.name() == "etcd"))
            .unwrap_or(false);
        if running {
            bail!("etcd is running already");
        }
        let log = self.dir.join("logs").join("etcd.log");
        let proc = Proc::start("etcd", &program, &args, &log)?;
        if let Ok(mut procs) = self.procs.lock() {
            // first: stopping everything stays in reverse start order
            procs.insert(0, proc);
        }
        self.wait_apiserver_ready(tokio::time::Instant::now() + Duration::from_secs(60))
            .await
            .with_context(|| crate::process::log_tail(&log, 30))
    }

    /// etcd's client URL (`http://127.0.0.1:<port>`, no TLS), for a control plane this handle started.
    pub fn etcd_url(&self) -> Option<&str> {
        self.etcd_cmd.as_ref().map(|(_, _, url)| url.as_str())
    }

    fn adopt(&mut self, proc: Proc) {
        self.info.pids.push((proc.name().to_owned(), proc.pid()));
        if let Ok(mut procs) = self.procs.lock() {
            procs.push(proc);
        }
    }

    fn save_info(&self) -> anyhow::Result<()> {
        let path = self.dir.join(INFO_FILE);
        std::fs::write(&path, serde_json::to_vec_pretty(&self.info)?)?;
        Ok(())
    }

    fn check_processes(&self) -> anyhow::Result<()> {
        if let Ok(mut procs) = self.procs.lock() {
            for p in procs.iter_mut() {
                p.check_running()?;
            }
        }
        Ok(())
    }

    async fn wait_apiserver_ready(&self, deadline: tokio::time::Instant) -> anyhow::Result<()> {
        let mut last;
        loop {
            self.check_processes()?;
            match self.admin_client().await {
                Ok(client) => {
                    let req = http_get("/readyz")?;
                    match client.request_text(req).await {
                        Ok(body) if body.trim() == "ok" => return Ok(()),
                        Ok(body) => last = body,
                        Err(e) => last = e.to_string(),
                    }
                }
                Err(e) => last = format!("{e:#}"),
            }
            if tokio::time::Instant::now() >= deadline {
                bail!("timed out; last answer: {last}");
            }
            tokio::time::sleep(Duration::from_millis(250)).await;
        }
    }

    /// The controller-manager runs: its service-account controller created `default/default` and its root CA
    /// publisher `default/kube-root-ca.crt`.
    async fn wait_controller_manager(&self, deadline: tokio::time::Instant) -> anyhow::Result<()> {
        let client = self.admin_client().await?;
        let sas: Api<ServiceAccount> = Api::namespaced(client.clone(), "default");
        // every pod's token volume names the root CA ConfigMap; its publisher runs apart from the accounts'
        let maps: Api<ConfigMap> = Api::namespaced(client, "default");
        loop {
            self.check_processes()?;
            if sas.get_opt("default").await?.is_some() && maps.get_opt("kube-root-ca.crt").await?.is_some() {
                return Ok(());
            }
            if tokio::time::Instant::now() >= deadline {
                bail!(
                    "kube-controller-manager did not create the service account default/default and the \
                     ConfigMap default/kube-root-ca.crt in time"
                );
            }
            tokio::time::sleep(Duration::from_millis(250)).await;
        }
    }

    /// The control plane's directory (certificates, kubeconfigs, `logs/`).
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// Endpoints, version, binaries and PIDs.
    pub fn info(&self) -> &Info {
        &self.info
    }

    /// `https://127.0.0.1:<port>`.
    pub fn server(&self) -> &str {
        &self.info.server
    }

    /// PIDs of the processes this handle started (empty when attached).
    pub fn pids(&self) -> Vec<u32> {
        self.procs
            .lock()
            .map(|p| p.iter().map(Proc::pid).collect())
            .unwrap_or_default()
    }

    async fn stop_processes(&self) {
        let procs: Vec<Proc> = self
            .procs
            .lock()
            .map(|mut p| p.drain(..).collect())
            .unwrap_or_default();
        // reverse start order: scheduler, controller-manager, apiserver, etcd
        for p in procs.into_iter().rev() {
            let name = p.name().to_owned();
            if let Err(e) = p.stop(Duration::from_secs(10)).await {
                tracing::warn!(name, error = %e, "stopping failed");
            }
        }
    }

    /// Stops every process this handle started (SIGTERM, then SIGKILL after 10 s) and, for a directory it made
    /// itself, removes it.
    pub async fn stop(self) -> anyhow::Result<()> {
        self.stop_processes().await;
        if self.remove_dir_on_stop {
            let _ = std::fs::remove_dir_all(&self.dir);
        }
        Ok(())
    }
}

fn http_get(path: &str) -> anyhow::Result<http::Request<Vec<u8>>> {
    Ok(http::Request::get(path).body(Vec::new())?)
}

/// A kube client config from a kubeconfig file.
pub async fn config_from_file(path: &Path) -> anyhow::Result<Config> {
    let kc = Kubeconfig::read_from(path).with_context(|| format!("reading {}", path.display()))?;
    Ok(Config::from_custom_kubeconfig(kc, &KubeConfigOptions::default()).await?)
}
