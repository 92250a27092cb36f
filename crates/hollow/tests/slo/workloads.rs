//! Bad input refused before any pod exists; Deployments in bursts with churn and Jobs from a template.

use super::*;

/// Pods in `namespace` right now.
async fn pods_in(cp: &testenv::ControlPlane, namespace: &str) -> anyhow::Result<usize> {
    let api: Api<Pod> = Api::namespaced(cp.admin_client().await?, namespace);
    Ok(api.list(&Default::default()).await?.items.len())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_input_is_refused_before_any_pod_is_created() -> anyhow::Result<()> {
    init_logging();
    let cp = control_plane().await?;
    let dir = tempfile::tempdir()?;
    let kubeconfig = cp.admin_kubeconfig();
    let run = |extra: &[&str]| -> anyhow::Result<(bool, String)> {
        let out = hollow_bin()
            .args(["slo", "--count", "5"])
            .args(extra)
            .arg("--report")
            .arg(dir.path().join("r"))
            .output()?;
        Ok((
            out.status.success(),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        ))
    };
    let kc = kubeconfig.to_str().unwrap_or_default();
    let namespaces: Api<Namespace> = Api::all(cp.admin_client().await?);

    let (ok, err) = run(&["--rate", "0", "--kubeconfig", kc, "--namespace", "slo-bad-rate"])?;
    assert!(!ok && err.contains("--rate must be a positive"), "{err}");
    assert!(
        namespaces.get_opt("slo-bad-rate").await?.is_none(),
        "nothing touched the cluster"
    );

    let not_template = dir.path().join("cm.yaml");
    std::fs::write(
        &not_template,
        "apiVersion: v1\nkind: ConfigMap\nmetadata: {name: x}\ndata: {a: b}\n",
    )?;
    let (ok, err) = run(&[
        "--rate",
        "5",
        "--kubeconfig",
        kc,
        "--template",
        not_template.to_str().unwrap_or_default(),
    ])?;
    assert!(!ok && err.contains("not a pod template: kind ConfigMap"), "{err}");

    let unreachable = dir.path().join("unreachable.kubeconfig");
    std::fs::write(
        &unreachable,
        "apiVersion: v1\nkind: Config\nclusters: [{name: c, cluster: {server: \"https://127.0.0.1:1\", insecure-skip-tls-verify: true}}]\n\
         users: [{name: u, user: {token: t}}]\ncontexts: [{name: x, context: {cluster: c, user: u}}]\ncurrent-context: x\n",
    )?;
    let (ok, err) = run(&[
        "--rate",
        "5",
        "--kubeconfig",
        unreachable.to_str().unwrap_or_default(),
    ])?;
    assert!(
        !ok && err.contains("cannot reach the API server") && err.contains("127.0.0.1:1"),
        "{err}"
    );

    // the first namespace can be made, the second cannot: the error comes before any pod, and the first
    // is removed again
    let (ok, err) = run(&[
        "--rate",
        "5",
        "--kubeconfig",
        kc,
        "--namespace",
        "slo-bad-ok",
        "--namespace",
        "Bad_Name",
    ])?;
    assert!(
        !ok && err.contains("namespace Bad_Name cannot be created"),
        "{err}"
    );
    assert_eq!(pods_in(cp, "slo-bad-ok").await?, 0, "no pod created");
    let left = namespaces.get_opt("slo-bad-ok").await?;
    assert!(
        left.is_none_or(|n| n.metadata.deletion_timestamp.is_some()),
        "the namespace made for the run is deleted"
    );
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn deployments_in_bursts_with_churn_and_jobs_from_a_template_are_measured_and_cleaned_up()
-> anyhow::Result<()> {
    init_logging();
    let _serial = SERIAL.lock().await;
    let cp = control_plane().await?;
    let fleet = start_fleet(cp, "kinds", 10, &[]).await?;
    let url = format!("http://{}", fleet.addr);
    let namespaces: Api<Namespace> = Api::all(cp.admin_client().await?);

    // bursts of 4 Deployments (3 replicas each) every second for 2 s, over two namespaces, then 1 s of churn:
    // the first burst's 4 objects are deleted and 4 new ones made
    let result = slo(
        cp,
        &[
            "--kind",
            "deployment",
            "--replicas",
            "3",
            "--burst-size",
            "4",
            "--burst-every",
            "1s",
            "--duration",
            "2s",
            "--churn",
            "1s",
            "--namespace",
            "slo-k1",
            "--namespace",
            "slo-k2",
            "--node-selector",
            "fleet=kinds",
            "--fleet",
            &url,
        ],
    )
    .await?;
    println!("{}", hollow::slo::report::table(&result));
    assert_eq!(
        (result.load.created, result.load.churned),
        (12, 4),
        "8 in bursts, 4 by churn"
    );
    assert_eq!(result.expected_pods, 36);
    assert_eq!(result.load.asked_rate, 4.0);
    assert_eq!(result.cluster.pods, 36, "every Deployment's pods measured");
    assert_eq!(result.not_running, 0);
    let of_churn = result
        .records
        .iter()
        .filter(|r| (8..12).any(|i| r.name.starts_with(&format!("slo-{}-{i}-", result.run_id))))
        .count();
    assert_eq!(of_churn, 12, "the Deployments churn made ran their pods");
    for ns in ["slo-k1", "slo-k2"] {
        assert!(result.records.iter().any(|r| r.namespace == ns), "pods in {ns}");
        let left = namespaces.get_opt(ns).await?;
        assert!(
            left.is_none_or(|n| n.metadata.deletion_timestamp.is_some()),
            "{ns}, made for the run, is deleted at cleanup"
        );
    }

    // Jobs from a user's Pod manifest, kept afterwards
    let dir = tempfile::tempdir()?;
    let template = dir.path().join("pod.yaml");
    std::fs::write(
        &template,
        "apiVersion: v1\nkind: Pod\nmetadata: {name: ignored, labels: {team: perf}}\n\
         spec: {containers: [{name: worker, image: registry.test/worker:1, resources: {requests: {cpu: 100m}}}]}\n",
    )?;
    let result = slo(
        cp,
        &[
            "--kind",
            "job",
            "--replicas",
            "2",
            "--count",
            "3",
            "--rate",
            "10",
            "--namespace",
            "slo-jobs",
            "--keep",
            "--node-selector",
            "fleet=kinds",
            "--template",
            template.to_str().unwrap_or_default(),
        ],
    )
    .await?;
    fleet.stop().await;
    assert_eq!(result.cluster.running, 6, "3 Jobs of 2 pods each ran");
    let pods: Api<Pod> = Api::namespaced(cp.admin_client().await?, "slo-jobs");
    let kept = pods
        .list(&kube::api::ListParams::default().labels("team=perf"))
        .await?
        .items;
    assert_eq!(
        kept.len(),
        6,
        "--keep leaves the pods, with the template's labels"
    );
    assert!(
        kept.iter()
            .all(|p| p.spec.as_ref().is_some_and(|s| s.containers[0].name == "worker"))
    );
    namespaces.delete("slo-jobs", &Default::default()).await?;
    Ok(())
}
