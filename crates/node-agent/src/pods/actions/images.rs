//! Making sure a container's image is present before it is created, per `imagePullPolicy`, with the kubelet's
//! events (`Pulling`, `Pulled`, `Failed`, `BackOff`, `ErrImageNeverPull`) and waiting reasons (`ErrImagePull`,
//! then `ImagePullBackOff` while a failed pull backs off 10 s doubling to 300 s, per image of the pod).

use std::collections::HashMap;
use std::time::Duration;

use runtime_api::cri;
use tokio::time::Instant;

use crate::backoff::{BackoffPolicy, KeyedBackoff};
use crate::pods::actions::context::ActionCtx;
use crate::pods::events::EventType;
use crate::pods::model::gofmt;
use crate::pods::model::spec::{ContainerSpec, DesiredPod, PullPolicy};

/// The image is there, or why the container has to wait.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum ImageState {
    /// Present (reference as the runtime resolved it); `pulled` is how long a pull took, if one ran.
    Ready { pulled: Option<Duration> },
    /// Not present: the container waits with this reason and message.
    Waiting { reason: &'static str, message: String },
}

/// Image pulls of one pod, with their back-off.
#[derive(Debug, Default)]
pub(crate) struct Images {
    /// Made at the first failed pull (most pods never have one).
    failures: Option<Box<Failures>>,
}

#[derive(Debug)]
struct Failures {
    backoff: KeyedBackoff<String>,
    /// Per image: when the failed pull may be retried, and its error.
    failed: HashMap<String, (Instant, String)>,
}

impl Default for Failures {
    fn default() -> Self {
        let policy = BackoffPolicy::new(Duration::from_secs(10), Duration::from_secs(300))
            .unwrap_or_else(|_| BackoffPolicy::crash_loop());
        Self {
            backoff: KeyedBackoff::new(policy),
            failed: HashMap::new(),
        }
    }
}

impl Images {
    /// The time until the image of a container waiting in back-off may be pulled again.
    pub(crate) fn retry_in(&self, image: &str, now: Instant) -> Option<Duration> {
        let (at, _) = self.failures.as_ref()?.failed.get(image)?;
        (*at > now).then(|| *at - now)
    }

    /// Ensures `c`'s image is present.
    pub(crate) async fn ensure(
        &mut self,
        ctx: &ActionCtx,
        pod: &DesiredPod,
        c: &ContainerSpec,
        sandbox: &cri::PodSandboxConfig,
    ) -> ImageState {
        let image = c.image.as_str();
        if image.is_empty() {
            return ImageState::Waiting {
                reason: "InvalidImageName",
                message: "image name is empty".into(),
            };
        }
        let spec = cri::ImageSpec {
            image: image.to_owned(),
            user_specified_image: image.to_owned(),
            ..Default::default()
        };
        let present = match ctx
            .rt(
                "image_status",
                ctx.runtime.image_status(cri::ImageStatusRequest {
                    image: Some(spec.clone()),
                    verbose: false,
                }),
            )
            .await
        {
            Ok(resp) => resp.image.is_some(),
            Err(e) => {
                return ImageState::Waiting {
                    reason: "ErrImageInspect",
                    message: format!("Failed to inspect image {image:?}: {e}"),
                };
            }
        };
        let pull = match c.pull_policy {
            PullPolicy::Always => true,
            PullPolicy::IfNotPresent => !present,
            PullPolicy::Never => false,
        };
        if !pull {
            if present {
                let msg = format!("Container image {image:?} already present on machine");
                ctx.events
                    .container(pod, &c.name, EventType::Normal, "Pulled", msg);
                return ImageState::Ready { pulled: None };
            }
            let msg = format!("Container image {image:?} is not present with pull policy of Never");
            ctx.events
                .container(pod, &c.name, EventType::Warning, "ErrImageNeverPull", msg.clone());
            return ImageState::Waiting {
                reason: "ErrImageNeverPull",
                message: msg,
            };
        }
        let now = Instant::now();
        let key = image.to_owned();
        if let Some((_, cause)) = self
            .failures
            .as_ref()
            .and_then(|f| f.failed.get(image))
            .filter(|(at, _)| *at > now)
        {
            ctx.events.container(
                pod,
                &c.name,
                EventType::Normal,
                "BackOff",
                format!("Back-off pulling image {image:?}"),
            );
            ctx.events.container(
                pod,
                &c.name,
                EventType::Warning,
                "Failed",
                "Error: ImagePullBackOff",
            );
            return ImageState::Waiting {
                reason: "ImagePullBackOff",
                message: format!("Back-off pulling image {image:?}: ErrImagePull: {cause}"),
            };
        }
        ctx.events.container(
            pod,
            &c.name,
            EventType::Normal,
            "Pulling",
            format!("Pulling image {image:?}"),
        );
        // the node's pull pacing (serializeImagePulls, maxParallelImagePulls, registryPullQPS/Burst)
        let queued = Instant::now();
        let _slot = ctx.pulls.acquire().await;
        let started = Instant::now();
        // each matching credential of the pod's imagePullSecrets in turn, or one anonymous pull
        let creds = if pod.image_pull_secrets().is_empty() {
            Vec::new()
        } else {
            crate::pods::actions::pull_secrets::credentials(
                &*ctx.objects,
                &pod.namespace,
                pod.image_pull_secrets(),
                image,
            )
            .await
        };
        let attempts: Vec<Option<cri::AuthConfig>> = if creds.is_empty() {
            vec![None]
        } else {
            creds.into_iter().map(Some).collect()
        };
        let mut result = Err(runtime_api::RuntimeError::unavailable("no pull attempted"));
        for auth in attempts {
            let req = cri::PullImageRequest {
                image: Some(spec.clone()),
                auth,
                sandbox_config: Some(sandbox.clone()),
            };
            result = ctx.rt("pull_image", ctx.runtime.pull_image(req)).await;
            if result.is_ok() {
                break;
            }
        }
        match result {
            Ok(_) => {
                let took = started.elapsed();
                ctx.metrics.image_pulled(took);
                let (t, total) = (gofmt::duration(took), gofmt::duration(queued.elapsed()));
                let msg = format!("Successfully pulled image {image:?} in {t} ({total} including waiting)");
                ctx.events
                    .container(pod, &c.name, EventType::Normal, "Pulled", msg);
                if let Some(f) = self.failures.as_mut() {
                    f.backoff.reset(&key);
                    f.failed.remove(image);
                    if f.failed.is_empty() {
                        self.failures = None;
                    }
                }
                ImageState::Ready { pulled: Some(took) }
            }
            Err(e) => {
                let failures = self.failures.get_or_insert_with(Box::default);
                let delay = failures.backoff.next(&key, Instant::now());
                let msg = format!("Failed to pull image {image:?}: {}", e.message);
                ctx.events
                    .container(pod, &c.name, EventType::Warning, "Failed", msg.clone());
                ctx.events
                    .container(pod, &c.name, EventType::Warning, "Failed", "Error: ErrImagePull");
                failures
                    .failed
                    .insert(key, (Instant::now() + delay, e.message.clone()));
                ImageState::Waiting {
                    reason: "ErrImagePull",
                    message: msg,
                }
            }
        }
    }
}
