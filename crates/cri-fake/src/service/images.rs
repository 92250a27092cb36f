//! The image service (ListImages, ImageStatus, PullImage, RemoveImage, ImageFsInfo) and the stats calls.

use runtime_api::{Result, RuntimeError, cri};

use super::{invalid, map_iter, unknown};
use crate::images::Reference;
use crate::runtime::FakeRuntime;
use crate::script::{self, Sources};
use crate::store::CState;
use crate::view::IMAGE_FS;

pub(super) async fn list_images(
    rt: &FakeRuntime,
    req: cri::ListImagesRequest,
) -> Result<cri::ListImagesResponse> {
    rt.check_reachable()?;
    let st = rt.lock();
    let wanted = req
        .filter
        .and_then(|f| f.image)
        .map(|i| i.image)
        .filter(|i| !i.is_empty());
    let images = match wanted {
        Some(spec) => st
            .images
            .find(&spec)
            .and_then(|i| st.images.get(i))
            .map(|i| i.to_cri())
            .into_iter()
            .collect(),
        None => st.images.iter().map(|i| i.to_cri()).collect(),
    };
    Ok(cri::ListImagesResponse { images })
}

pub(super) async fn image_status(
    rt: &FakeRuntime,
    req: cri::ImageStatusRequest,
) -> Result<cri::ImageStatusResponse> {
    rt.check_reachable()?;
    let st = rt.lock();
    let spec = req.image.map(|i| i.image).unwrap_or_default();
    let image = st
        .images
        .find(&spec)
        .and_then(|i| st.images.get(i))
        .map(|i| i.to_cri());
    Ok(cri::ImageStatusResponse {
        image,
        info: Default::default(),
    })
}

pub(super) async fn pull_image(
    rt: &FakeRuntime,
    req: cri::PullImageRequest,
) -> Result<cri::PullImageResponse> {
    rt.check_reachable()?;
    let spec = req.image.map(|i| i.image).unwrap_or_default();
    let reference = Reference::parse(&spec)
        .ok_or_else(|| RuntimeError::invalid_argument(format!("failed to parse image reference {spec:?}")))?;
    let pod = req.sandbox_config.map(|c| c.annotations).unwrap_or_default();
    let script = script::resolve(
        rt.inner.profile.script_arc(),
        Sources {
            pod: map_iter(&pod),
            container: None,
            own: std::iter::empty(),
        },
    )
    .map_err(invalid)?;
    let takes = script.pull_duration.sample(&mut rt.lock().rng);
    FakeRuntime::pause(takes).await;
    if let Some(message) = &script.pull_error {
        return Err(unknown(format!(
            "failed to pull and unpack image {spec:?}: {message}"
        )));
    }
    let mut st = rt.lock();
    let image = st
        .images
        .add(&reference, script.image_size, script.image_user.as_deref());
    Ok(cri::PullImageResponse {
        image_ref: image.id().to_owned(),
    })
}

pub(super) async fn remove_image(
    rt: &FakeRuntime,
    req: cri::RemoveImageRequest,
) -> Result<cri::RemoveImageResponse> {
    rt.check_reachable()?;
    let spec = req.image.map(|i| i.image).unwrap_or_default();
    rt.lock().images.remove(&spec);
    Ok(cri::RemoveImageResponse {})
}

pub(super) async fn image_fs_info(
    rt: &FakeRuntime,
    _req: cri::ImageFsInfoRequest,
) -> Result<cri::ImageFsInfoResponse> {
    rt.check_reachable()?;
    let (st, now) = rt.settled();
    Ok(cri::ImageFsInfoResponse {
        image_filesystems: vec![cri::FilesystemUsage {
            timestamp: now,
            fs_id: Some(cri::FilesystemIdentifier {
                mountpoint: IMAGE_FS.into(),
            }),
            used_bytes: Some(cri::UInt64Value {
                value: st.images.total_size(),
            }),
            inodes_used: Some(cri::UInt64Value {
                value: st.images.len() as u64,
            }),
        }],
        container_filesystems: Vec::new(),
    })
}

pub(super) async fn container_stats(
    rt: &FakeRuntime,
    req: cri::ContainerStatsRequest,
) -> Result<cri::ContainerStatsResponse> {
    rt.check_reachable()?;
    let (st, now) = rt.settled();
    let key = st
        .container_key(&req.container_id)
        .map_err(|_| RuntimeError::not_found("failed to find container: not found"))?;
    // like containerd: only a running task has metrics
    if st.containers[&key].state != CState::Running {
        return Err(unknown(format!(
            "failed to decode container metrics for {:?}: no running task",
            req.container_id
        )));
    }
    Ok(cri::ContainerStatsResponse {
        stats: st.container_stats(key, now),
    })
}

pub(super) async fn list_container_stats(
    rt: &FakeRuntime,
    req: cri::ListContainerStatsRequest,
) -> Result<cri::ListContainerStatsResponse> {
    rt.check_reachable()?;
    let (st, now) = rt.settled();
    let f = req.filter.unwrap_or_default();
    let running = Some(cri::ContainerState::ContainerRunning as i32);
    let keys = st.select_containers(&f.id, &f.pod_sandbox_id, running, Some(&f.label_selector));
    Ok(cri::ListContainerStatsResponse {
        stats: keys
            .into_iter()
            .filter_map(|k| st.container_stats(k, now))
            .collect(),
    })
}

pub(super) async fn pod_sandbox_stats(
    rt: &FakeRuntime,
    req: cri::PodSandboxStatsRequest,
) -> Result<cri::PodSandboxStatsResponse> {
    rt.check_reachable()?;
    let (st, now) = rt.settled();
    let key = st.sandbox_key(&req.pod_sandbox_id)?;
    Ok(cri::PodSandboxStatsResponse {
        stats: st.sandbox_stats(key, now),
    })
}

pub(super) async fn list_pod_sandbox_stats(
    rt: &FakeRuntime,
    req: cri::ListPodSandboxStatsRequest,
) -> Result<cri::ListPodSandboxStatsResponse> {
    rt.check_reachable()?;
    let (st, now) = rt.settled();
    let f = req.filter.unwrap_or_default();
    let filter = cri::PodSandboxFilter {
        id: f.id,
        state: Some(cri::PodSandboxStateValue {
            state: cri::PodSandboxState::SandboxReady as i32,
        }),
        label_selector: f.label_selector,
    };
    let stats = st
        .list_sandboxes(Some(&filter))
        .iter()
        .filter_map(|sb| st.sandbox_key(&sb.id).ok())
        .filter_map(|key| st.sandbox_stats(key, now))
        .collect();
    Ok(cri::ListPodSandboxStatsResponse { stats })
}
