//! The fake image store: references normalised the way container runtimes do (`nginx` →
//! `docker.io/library/nginx:latest`), deterministic ids and digests derived from the content a reference names
//! (the same image has the same id on every fake node), sizes and the config's `User` from the script.
//!
//! One image is one content: its id is derived from its manifest digest, and a tag's digest from the
//! repository path and tag without the registry, so `registry-a/team/app:1` and `registry-b/team/app:1` are the
//! same image, and pulling `repo@sha256:<digest>` after `repo:tag` finds it again. An image collects every
//! reference it was pulled by: ListImages shows all its repoTags and repoDigests, and removing it by any of
//! them removes it under all (as containerd's CRI does).

use std::collections::HashMap;
use std::sync::{Arc, LazyLock, Mutex, Weak};

use runtime_api::cri;

/// One reference to an image (a tag or a digest reference) with the id and repo digest of the content it
/// names: the same for every fake runtime holding it, so it is shared process-wide (a fleet of ten thousand
/// nodes pulling the same images keeps one copy).
#[derive(Debug)]
pub(crate) struct ImageMeta {
    pub(crate) id: Box<str>,
    /// The reference as normalised: what containers created from it report as their image.
    pub(crate) name: Box<str>,
    pub(crate) tag: Option<Box<str>>,
    pub(crate) digest: Box<str>,
}

impl ImageMeta {
    /// The reference a container created from this image reports (`image_ref`): the repo digest.
    pub(crate) fn image_ref(&self) -> &str {
        &self.digest
    }

    fn build(reference: &Reference, canonical: &str) -> ImageMeta {
        let content = reference.content_digest();
        ImageMeta {
            id: format!("sha256:{}", hash_hex(&content, 1)).into(),
            name: canonical.into(),
            tag: reference.tagged().map(String::into_boxed_str),
            digest: format!("{}@{content}", reference.repo).into(),
        }
    }

    /// The shared description of the reference `canonical` names.
    fn shared(reference: &Reference, canonical: &str) -> Arc<ImageMeta> {
        static SHARED: LazyLock<Mutex<SharedImages>> = LazyLock::new(|| Mutex::new((HashMap::new(), 0)));
        let mut guard = SHARED.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        let (cache, inserts) = &mut *guard;
        if let Some(meta) = cache.get(canonical).and_then(Weak::upgrade) {
            return meta;
        }
        *inserts += 1;
        if *inserts % 1024 == 0 {
            cache.retain(|_, weak| weak.strong_count() > 0);
        }
        let meta = Arc::new(ImageMeta::build(reference, canonical));
        cache.insert(canonical.into(), Arc::downgrade(&meta));
        meta
    }
}

/// The process-wide reference descriptions by canonical reference, and how many were added (to prune dead
/// ones now and then).
type SharedImages = (HashMap<Box<str>, Weak<ImageMeta>>, usize);

/// One image in the store of a runtime: every reference it was pulled by (the first one first).
#[derive(Debug, Clone)]
pub(crate) struct Image {
    pub(crate) refs: Box<[Arc<ImageMeta>]>,
    pub(crate) size: u64,
    /// The image config's `User` (`uid`, `name`, `uid:gid` or `name:group`); `None` = not set.
    pub(crate) user: Option<Box<str>>,
    /// Pinned by the runtime (a kubelet never garbage collects it).
    pub(crate) pinned: bool,
}

impl Image {
    pub(crate) fn id(&self) -> &str {
        self.refs.first().map_or("", |r| &r.id)
    }

    pub(crate) fn to_cri(&self) -> cri::Image {
        let mut repo_tags: Vec<String> = Vec::new();
        let mut repo_digests: Vec<String> = Vec::new();
        for r in self.refs.iter() {
            if let Some(tag) = &r.tag
                && !repo_tags.iter().any(|t| t == &**tag)
            {
                repo_tags.push(tag.to_string());
            }
            if !repo_digests.iter().any(|d| d == &*r.digest) {
                repo_digests.push(r.digest.to_string());
            }
        }
        // like containerd: a numeric user is the uid, anything else the username
        let user = self
            .user
            .as_deref()
            .map(|u| u.split_once(':').map_or(u, |(user, _)| user))
            .filter(|u| !u.is_empty());
        let (uid, username) = match user.map(|u| (u, u.parse::<i64>())) {
            Some((_, Ok(uid))) => (Some(cri::Int64Value { value: uid }), String::new()),
            Some((name, Err(_))) => (None, name.to_owned()),
            None => (None, String::new()),
        };
        cri::Image {
            id: self.id().to_owned(),
            repo_tags,
            repo_digests,
            size: self.size,
            uid,
            username,
            spec: Some(cri::ImageSpec {
                image: self.id().to_owned(),
                ..Default::default()
            }),
            pinned: self.pinned,
        }
    }
}

/// A reference split into repository and tag or digest, normalised.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Reference {
    pub(crate) repo: String,
    pub(crate) tag: Option<String>,
    pub(crate) digest: Option<String>,
}

impl Reference {
    pub(crate) fn parse(text: &str) -> Option<Reference> {
        let text = text.trim();
        if text.is_empty() || text.contains(char::is_whitespace) {
            return None;
        }
        let (name, digest) = match text.split_once('@') {
            Some((n, d)) if d.starts_with("sha256:") => (n, Some(d.to_owned())),
            Some(_) => return None,
            None => (text, None),
        };
        let slash = name.rfind('/').map_or(0, |i| i + 1);
        let (repo, tag) = match name[slash..].rfind(':') {
            Some(i) => (&name[..slash + i], Some(name[slash + i + 1..].to_owned())),
            None => (name, None),
        };
        if repo.is_empty() || tag.as_deref() == Some("") {
            return None;
        }
        let repo = match repo.split_once('/') {
            Some((domain, _)) if domain.contains(['.', ':']) || domain == "localhost" => repo.to_owned(),
            Some(_) => format!("docker.io/{repo}"),
            None => format!("docker.io/library/{repo}"),
        };
        let tag = if tag.is_none() && digest.is_none() {
            Some("latest".to_owned())
        } else {
            tag
        };
        Some(Reference { repo, tag, digest })
    }

    pub(crate) fn tagged(&self) -> Option<String> {
        self.tag.as_ref().map(|t| format!("{}:{t}", self.repo))
    }

    pub(crate) fn digested(&self) -> Option<String> {
        self.digest.as_ref().map(|d| format!("{}@{d}", self.repo))
    }

    /// The digest of the content this reference names: the given digest, else one derived from the
    /// repository path (without the registry) and tag, so mirrors of one image agree.
    pub(crate) fn content_digest(&self) -> String {
        if let Some(d) = &self.digest {
            return d.clone();
        }
        let path = match self.repo.split_once('/') {
            Some((_, path)) => path,
            None => &self.repo,
        };
        format!(
            "sha256:{}",
            hash_hex(&format!("{path}:{}", self.tag.as_deref().unwrap_or("")), 2)
        )
    }
}

/// A 256-bit hex hash of `text` (not cryptographic; stable across runs and processes).
pub(crate) fn hash_hex(text: &str, salt: u64) -> String {
    let mut out = String::with_capacity(64);
    for lane in 0..4u64 {
        let mut h: u64 = 0xcbf2_9ce4_8422_2325 ^ salt ^ lane.wrapping_mul(0x9e37_79b9_7f4a_7c15);
        for b in text.bytes() {
            h = (h ^ u64::from(b)).wrapping_mul(0x0000_0100_0000_01b3);
        }
        h ^= h >> 33;
        h = h.wrapping_mul(0xff51_afd7_ed55_8ccd);
        h ^= h >> 33;
        out.push_str(&format!("{h:016x}"));
    }
    out
}

/// The images of one runtime.
#[derive(Debug, Default)]
pub(crate) struct Images {
    list: Vec<Image>,
}

impl Images {
    /// The index of the image `spec` names: an id (`sha256:…`, or its hex), a tag, or a repo digest.
    pub(crate) fn find(&self, spec: &str) -> Option<usize> {
        self.resolve(spec).map(|(i, _)| i)
    }

    /// The image `spec` names and the reference it matched (for an id: the image's first reference).
    pub(crate) fn resolve(&self, spec: &str) -> Option<(usize, Arc<ImageMeta>)> {
        let spec = spec.trim();
        if spec.is_empty() {
            return None;
        }
        let bare = spec.strip_prefix("sha256:").unwrap_or(spec);
        if bare.len() == 64 && bare.bytes().all(|b| b.is_ascii_hexdigit()) {
            let by_id = self
                .list
                .iter()
                .position(|img| img.id().strip_prefix("sha256:") == Some(bare));
            if let Some(i) = by_id {
                return Some((i, self.list[i].refs[0].clone()));
            }
        }
        self.find_reference(&Reference::parse(spec)?)
    }

    fn find_reference(&self, reference: &Reference) -> Option<(usize, Arc<ImageMeta>)> {
        let tagged = reference.tagged();
        let digested = reference.digested();
        self.list.iter().enumerate().find_map(|(i, img)| {
            img.refs
                .iter()
                .find(|r| match (&tagged, &digested) {
                    (Some(t), _) => r.tag.as_deref() == Some(t.as_str()),
                    (None, Some(d)) => &*r.digest == d.as_str(),
                    (None, None) => false,
                })
                .map(|r| (i, r.clone()))
        })
    }

    pub(crate) fn get(&self, index: usize) -> Option<&Image> {
        self.list.get(index)
    }

    pub(crate) fn iter(&self) -> impl Iterator<Item = &Image> {
        self.list.iter()
    }

    /// Record a pulled (or preloaded) image under `reference` and return it. A reference already present
    /// keeps its image; a reference to content already present (the same image from another registry, or by
    /// digest) is added to that image; anything else is a new image.
    pub(crate) fn add(&mut self, reference: &Reference, size: u64, user: Option<&str>) -> &Image {
        let index = match self.find_reference(reference) {
            Some((i, _)) => i,
            None => {
                let canonical = reference
                    .tagged()
                    .or_else(|| reference.digested())
                    .unwrap_or_default();
                let meta = ImageMeta::shared(reference, &canonical);
                match self.list.iter().position(|img| img.id() == &*meta.id) {
                    Some(i) => {
                        let mut refs = self.list[i].refs.to_vec();
                        refs.push(meta);
                        self.list[i].refs = refs.into_boxed_slice();
                        i
                    }
                    None => {
                        // grown one at a time: a node holds a few images, and doubling left room for several more
                        self.list.reserve_exact(1);
                        self.list.push(Image {
                            refs: Box::new([meta]),
                            size,
                            user: user.map(Into::into),
                            pinned: false,
                        });
                        self.list.len() - 1
                    }
                }
            }
        };
        &self.list[index]
    }

    /// Pin the image `spec` names (nothing happens when it is not there).
    pub(crate) fn pin(&mut self, spec: &str) {
        if let Some(i) = self.find(spec) {
            self.list[i].pinned = true;
        }
    }

    /// Remove the image `spec` names, under every reference it has; `false` if it was not there.
    pub(crate) fn remove(&mut self, spec: &str) -> bool {
        match self.find(spec) {
            Some(i) => {
                self.list.remove(i);
                true
            }
            None => false,
        }
    }

    pub(crate) fn total_size(&self) -> u64 {
        self.list.iter().map(|i| i.size).sum()
    }

    pub(crate) fn len(&self) -> usize {
        self.list.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn references_normalise_like_a_runtime() {
        let cases = [
            ("nginx", "docker.io/library/nginx:latest"),
            ("nginx:1.25", "docker.io/library/nginx:1.25"),
            ("library/nginx:1", "docker.io/library/nginx:1"),
            ("bitnami/redis", "docker.io/bitnami/redis:latest"),
            ("registry.k8s.io/pause:3.10", "registry.k8s.io/pause:3.10"),
            ("localhost/busybox:local", "localhost/busybox:local"),
            ("localhost:5000/app", "localhost:5000/app:latest"),
        ];
        for (input, want) in cases {
            assert_eq!(
                Reference::parse(input).unwrap().tagged().unwrap(),
                want,
                "{input}"
            );
        }
        let d = Reference::parse("nginx@sha256:abc").unwrap();
        assert_eq!(d.tagged(), None);
        assert_eq!(d.digested().unwrap(), "docker.io/library/nginx@sha256:abc");
        for bad in ["", "a b", "nginx:", "x@md5:1"] {
            assert_eq!(Reference::parse(bad), None, "{bad:?}");
        }
    }

    #[test]
    fn images_are_found_by_tag_id_and_digest() {
        let mut images = Images::default();
        let img = images
            .add(&Reference::parse("nginx:1.25").unwrap(), 1000, None)
            .refs[0]
            .clone();
        assert!(img.id.starts_with("sha256:") && img.id.len() == 71);
        assert_eq!(&*img.name, "docker.io/library/nginx:1.25");
        assert_eq!(images.find("docker.io/library/nginx:1.25"), Some(0));
        assert_eq!(images.find("nginx:1.25"), Some(0));
        assert_eq!(images.find(&img.id), Some(0));
        assert_eq!(images.find(&img.id[7..]), Some(0));
        assert_eq!(images.find(&img.digest), Some(0));
        assert_eq!(images.find("nginx:1.26"), None);
        // same name, same id everywhere; pulling again does not duplicate
        let mut other = Images::default();
        let again = other
            .add(
                &Reference::parse("docker.io/library/nginx:1.25").unwrap(),
                1,
                None,
            )
            .refs[0]
            .clone();
        assert!(Arc::ptr_eq(&again, &img), "shared between runtimes");
        images.add(&Reference::parse("nginx:1.25").unwrap(), 1000, None);
        assert_eq!(images.len(), 1);
        assert!(images.remove("nginx:1.25"));
        assert!(!images.remove("nginx:1.25"));
    }

    #[test]
    fn pinned_images_say_so() {
        let mut images = Images::default();
        images.add(&Reference::parse("registry.k8s.io/pause:3.10").unwrap(), 1, None);
        images.add(&Reference::parse("busybox").unwrap(), 1, None);
        images.pin("registry.k8s.io/pause:3.10");
        let pinned: Vec<bool> = images.iter().map(|i| i.to_cri().pinned).collect();
        assert_eq!(pinned, [true, false]);
    }
}
