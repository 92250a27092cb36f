//! A container's environment, command and arguments as the kubelet builds them when it creates the container:
//! service links first ([`service_links`](crate::pods::actions::service_links)), then `envFrom` sources (ConfigMap / Secret keys with their prefix), then `env` in order — literal values
//! with `$(VAR)` references expanded against the variables before them, pod fields, the pod and host IPs,
//! ConfigMap and Secret keys, requests and limits — and finally `$(VAR)` expanded in command and args, and
//! in volume mounts' `subPathExpr` ([`sub_paths`]).
//!
//! A missing object or key that is not optional fails the container's creation with the kubelet's
//! `CreateContainerConfigError` message; the worker reports it and retries.

use std::collections::HashMap;

use runtime_api::cri;

use crate::pods::actions::context::ActionCtx;
use crate::pods::actions::objects::ObjectKind;
use crate::pods::actions::volumes::content;
use crate::pods::model::spec::{ContainerSpec, DesiredPod, EnvValue, MountSpec};
use crate::pods::runtime::labels::Resolved;

/// The `subPath` of every mount of `c`, in order, with `env` its environment: see [`sub_path`].
pub fn sub_paths(c: &ContainerSpec, env: &[cri::KeyValue]) -> Result<Vec<String>, String> {
    c.mounts.iter().map(|m| sub_path(m, env)).collect()
}

/// The `subPath` of mount `m` of a container with environment `env`: `subPathExpr` expanded as the kubelet
/// expands it (a reference to a variable that is unset or empty is an error naming it), then checked to stay
/// inside the volume.
pub fn sub_path(m: &MountSpec, env: &[cri::KeyValue]) -> Result<String, String> {
    let path = if m.sub_path_expr.is_empty() {
        m.sub_path.clone()
    } else {
        let missing = std::cell::RefCell::new(std::collections::BTreeSet::new());
        let expanded = expand(&m.sub_path_expr, |name| {
            let value = env
                .iter()
                .rev()
                .find(|kv| kv.key == name)
                .map(|kv| kv.value.clone());
            if value.as_deref().is_none_or(str::is_empty) {
                missing.borrow_mut().insert(name.to_owned());
            }
            Some(value.unwrap_or_default())
        });
        let missing = missing.into_inner();
        if !missing.is_empty() {
            let names: Vec<String> = missing.into_iter().collect();
            return Err(format!("missing value for {}", names.join(", ")));
        }
        expanded
    };
    if path.starts_with('/') {
        return Err(format!("error SubPath `{path}` must not be an absolute path"));
    }
    if path.split('/').any(|part| part == "..") {
        return Err(format!(
            "unable to provision SubPath `{path}`: must not contain '..'"
        ));
    }
    Ok(path)
}

/// Expands `$(NAME)` in `input` with `lookup`; `$$` is a literal `$`; a reference to an unknown name, or one
/// never closed, stays as written.
pub fn expand(input: &str, lookup: impl Fn(&str) -> Option<String>) -> String {
    if !input.contains('$') {
        return input.to_owned();
    }
    let mut out = String::with_capacity(input.len());
    let mut rest = input;
    while let Some(at) = rest.find('$') {
        out.push_str(&rest[..at]);
        let after = &rest[at + 1..];
        if let Some(tail) = after.strip_prefix('$') {
            out.push('$');
            rest = tail;
        } else if let Some(inner) = after.strip_prefix('(') {
            match inner.find(')') {
                Some(end) => {
                    let name = &inner[..end];
                    match lookup(name) {
                        Some(v) => out.push_str(&v),
                        None => {
                            out.push_str("$(");
                            out.push_str(name);
                            out.push(')');
                        }
                    }
                    rest = &inner[end + 1..];
                }
                None => {
                    out.push_str("$(");
                    rest = inner;
                }
            }
        } else {
            out.push('$');
            rest = after;
        }
    }
    out.push_str(rest);
    out
}

/// An ordered environment: a later value of a name replaces the earlier one in its place.
#[derive(Default)]
struct Env {
    vars: Vec<(String, String)>,
    index: HashMap<String, usize>,
}

impl Env {
    fn set(&mut self, name: String, value: String) {
        match self.index.get(&name) {
            Some(&i) => self.vars[i].1 = value,
            None => {
                self.index.insert(name.clone(), self.vars.len());
                self.vars.push((name, value));
            }
        }
    }

    fn get(&self, name: &str) -> Option<String> {
        self.index.get(name).map(|&i| self.vars[i].1.clone())
    }
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

/// Builds the environment, command and args of `c` in `pod`, whose sandbox has `pod_ip`.
pub async fn resolve(
    ctx: &ActionCtx,
    pod: &DesiredPod,
    c: &ContainerSpec,
    pod_ip: &str,
    host_ip: &str,
) -> Result<Resolved, String> {
    let mut env = Env::default();
    for (name, value) in crate::pods::actions::service_links::vars(ctx, pod).await? {
        env.set(name, value);
    }
    for from in &c.env_from {
        let kind = if from.secret {
            ObjectKind::Secret
        } else {
            ObjectKind::ConfigMap
        };
        match ctx
            .objects
            .get(kind, &pod.namespace, &from.name)
            .await
            .map_err(|e| e.0)?
        {
            Some(data) => {
                for (k, v) in data.iter() {
                    env.set(format!("{}{k}", from.prefix), text(v));
                }
            }
            None if from.optional => {}
            None => return Err(not_found(kind, &from.name)),
        }
    }
    for (name, value) in &c.env {
        let value = match value {
            EnvValue::Literal(v) => v.clone(),
            EnvValue::Expand(v) => expand(v, |n| env.get(n)),
            EnvValue::PodIp => pod_ip.to_owned(),
            EnvValue::HostIp => host_ip.to_owned(),
            EnvValue::Resource(r) => content::resource_value(pod, Some(c), r, ctx.node.get().as_ref())?,
            EnvValue::ConfigMapKey(r) | EnvValue::SecretKey(r) => {
                let kind = if matches!(value, EnvValue::SecretKey(_)) {
                    ObjectKind::Secret
                } else {
                    ObjectKind::ConfigMap
                };
                let data = ctx
                    .objects
                    .get(kind, &pod.namespace, &r.name)
                    .await
                    .map_err(|e| e.0)?;
                match data.as_ref().map(|d| d.get(&r.key)) {
                    Some(Some(v)) => text(v),
                    _ if r.optional => continue,
                    None => return Err(not_found(kind, &r.name)),
                    Some(None) => {
                        return Err(format!(
                            "couldn't find key {} in {} {}/{}",
                            r.key,
                            kind.name(),
                            pod.namespace,
                            r.name
                        ));
                    }
                }
            }
        };
        env.set(name.clone(), value);
    }
    let lookup = |n: &str| env.get(n);
    let command = c.command.iter().map(|s| expand(s, lookup)).collect();
    let args = c.args.iter().map(|s| expand(s, lookup)).collect();
    Ok(Resolved {
        env: env
            .vars
            .into_iter()
            .map(|(key, value)| cri::KeyValue { key, value })
            .collect(),
        command,
        args,
        security: None,
    })
}

/// The kubelet's message for a missing object (its object managers name the resource in the singular).
fn not_found(kind: ObjectKind, name: &str) -> String {
    let resource = match kind {
        ObjectKind::ConfigMap => "configmap",
        ObjectKind::Secret => "secret",
    };
    format!("{resource} \"{name}\" not found")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sub_path_expr_is_expanded_from_the_environment_and_kept_inside_the_volume() {
        let env: Vec<cri::KeyValue> = [("POD", "web-0"), ("EMPTY", "")]
            .into_iter()
            .map(|(k, v)| cri::KeyValue {
                key: k.into(),
                value: v.into(),
            })
            .collect();
        let mount = |sub_path: &str, expr: &str| MountSpec {
            volume: Some(0),
            path: "/data".into(),
            sub_path: sub_path.into(),
            sub_path_expr: expr.into(),
            read_only: false,
            propagation: Default::default(),
        };
        assert_eq!(sub_path(&mount("", "logs/$(POD)"), &env), Ok("logs/web-0".into()));
        assert_eq!(sub_path(&mount("plain", ""), &env), Ok("plain".into()));
        assert_eq!(sub_path(&mount("", "$$(POD)"), &env), Ok("$(POD)".into()));
        assert_eq!(
            sub_path(&mount("", "$(NOPE)/$(EMPTY)/$(POD)"), &env),
            Err("missing value for EMPTY, NOPE".into()),
            "unset and empty variables are both missing, named in order"
        );
        assert_eq!(
            sub_path(&mount("", "/$(POD)"), &env),
            Err("error SubPath `/web-0` must not be an absolute path".into())
        );
        assert_eq!(
            sub_path(&mount("", "$(POD)/../x"), &env),
            Err("unable to provision SubPath `web-0/../x`: must not contain '..'".into())
        );
    }

    #[test]
    fn expansion_follows_the_kubelet_rules() {
        let vars: HashMap<&str, &str> = [("A", "1"), ("B", "two")].into();
        let e = |s: &str| expand(s, |n| vars.get(n).map(|v| (*v).to_owned()));
        assert_eq!(e("plain"), "plain");
        assert_eq!(e("$(A)-$(B)"), "1-two");
        assert_eq!(e("$(MISSING)"), "$(MISSING)");
        assert_eq!(e("$$(A)"), "$(A)", "$$ escapes");
        assert_eq!(e("cost $5"), "cost $5");
        assert_eq!(e("open $(A"), "open $(A");
        assert_eq!(e("end$"), "end$");
        assert_eq!(e("$()"), "$()");
    }

    #[test]
    fn later_values_replace_earlier_ones_in_place() {
        let mut env = Env::default();
        env.set("A".into(), "1".into());
        env.set("B".into(), "2".into());
        env.set("A".into(), "3".into());
        assert_eq!(
            env.vars,
            vec![("A".to_owned(), "3".to_owned()), ("B".to_owned(), "2".to_owned())]
        );
    }
}
