//! The fake image store: references normalised the way container runtimes do (`nginx` →
//! `docker.io/library/nginx:latest`), deterministic ids and digests derived from the name (the same image has
//! the same id on every fake node), sizes from the profile.

use std::collections::HashMap;
use std::sync::{Arc, LazyLock, Mutex, Weak};

use runtime_api::cri;

/// What is known about an image apart from its size: the same for every fake runtime holding it, so it is
/// shared process-wide (a fleet of ten thousand nodes pulling the same images keeps one copy).
#[derive(Debug)]
pub(crate) struct ImageMeta {
    pub(crate) id: Box<str>,
    /// What containers of this image report as their image: the first tag, else the digest reference.
    pub(crate) name: Box<str>,
    pub(crate) tags: Box<[Box<str>]>,
    pub(crate) digests: Box<[Box<str>]>,
}

impl ImageMeta {
    /// The reference a container created from this image reports (`image_ref`): the repo digest, else the id.
    pub(crate) fn image_ref(&self) -> &str {
        self.digests.first().unwrap_or(&self.id)
    }

    fn build(reference: &Reference, canonical: &str) -> ImageMeta {
        let digest = reference
            .digested()
            .unwrap_or_else(|| format!("{}@sha256:{}", reference.repo, hash_hex(canonical, 2)));
        ImageMeta {
            id: format!("sha256:{}", hash_hex(canonical, 1)).into(),
            name: canonical.into(),
            tags: reference
                .tagged()
                .map(String::into_boxed_str)
                .into_iter()
                .collect(),
            digests: Box::new([digest.into()]),
        }
    }

    /// The shared description of the image `canonical` names.
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

/// The process-wide image descriptions by canonical reference, and how many were added (to prune dead ones
/// now and then).
type SharedImages = (HashMap<Box<str>, Weak<ImageMeta>>, usize);

/// One image in the store of a runtime.
#[derive(Debug, Clone)]
pub(crate) struct Image {
    pub(crate) meta: Arc<ImageMeta>,
    pub(crate) size: u64,
}

impl Image {
    pub(crate) fn to_cri(&self) -> cri::Image {
        let meta = &self.meta;
        cri::Image {
            id: meta.id.to_string(),
            repo_tags: meta.tags.iter().map(|t| t.to_string()).collect(),
            repo_digests: meta.digests.iter().map(|d| d.to_string()).collect(),
            size: self.size,
            spec: Some(cri::ImageSpec {
                image: meta.id.to_string(),
                ..Default::default()
            }),
            ..Default::default()
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
        let spec = spec.trim();
        if spec.is_empty() {
            return None;
        }
        let bare = spec.strip_prefix("sha256:").unwrap_or(spec);
        let by_id = || {
            self.list
                .iter()
                .position(|img| img.meta.id.strip_prefix("sha256:") == Some(bare))
        };
        if bare.len() == 64
            && bare.bytes().all(|b| b.is_ascii_hexdigit())
            && let Some(i) = by_id()
        {
            return Some(i);
        }
        self.find_reference(&Reference::parse(spec)?)
    }

    fn find_reference(&self, reference: &Reference) -> Option<usize> {
        let tagged = reference.tagged();
        let digested = reference.digested();
        self.list.iter().position(|img| {
            tagged
                .as_deref()
                .is_some_and(|t| img.meta.tags.iter().any(|x| &**x == t))
                || digested
                    .as_deref()
                    .is_some_and(|d| img.meta.digests.iter().any(|x| &**x == d))
        })
    }

    pub(crate) fn get(&self, index: usize) -> Option<&Image> {
        self.list.get(index)
    }

    pub(crate) fn iter(&self) -> impl Iterator<Item = &Image> {
        self.list.iter()
    }

    /// Record a pulled (or preloaded) image and return it. Pulling a tag again keeps the existing image.
    pub(crate) fn add(&mut self, reference: &Reference, size: u64) -> &Image {
        let index = match self.find_reference(reference) {
            Some(i) => i,
            None => {
                let canonical = reference
                    .tagged()
                    .or_else(|| reference.digested())
                    .unwrap_or_default();
                self.list.push(Image {
                    meta: ImageMeta::shared(reference, &canonical),
                    size,
                });
                self.list.len() - 1
            }
        };
        &self.list[index]
    }

    /// Remove an image; `false` if it was not there.
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
            .add(&Reference::parse("nginx:1.25").unwrap(), 1000)
            .meta
            .clone();
        assert!(img.id.starts_with("sha256:") && img.id.len() == 71);
        assert_eq!(&*img.name, "docker.io/library/nginx:1.25");
        assert_eq!(images.find("docker.io/library/nginx:1.25"), Some(0));
        assert_eq!(images.find("nginx:1.25"), Some(0));
        assert_eq!(images.find(&img.id), Some(0));
        assert_eq!(images.find(&img.id[7..]), Some(0));
        assert_eq!(images.find(&img.digests[0]), Some(0));
        assert_eq!(images.find("nginx:1.26"), None);
        // same name, same id everywhere; pulling again does not duplicate
        let mut other = Images::default();
        let again = other
            .add(&Reference::parse("docker.io/library/nginx:1.25").unwrap(), 1)
            .meta
            .clone();
        assert!(Arc::ptr_eq(&again, &img), "shared between runtimes");
        images.add(&Reference::parse("nginx:1.25").unwrap(), 1000);
        assert_eq!(images.len(), 1);
        assert!(images.remove("nginx:1.25"));
        assert!(!images.remove("nginx:1.25"));
    }
}
