//! Generated bad input for the configuration: KubeletConfiguration text and fields of random shapes and values,
//! and every flag with a random value. Nothing panics, and every refusal names what is wrong — the field or
//! the flag (or, for text that is no YAML mapping at all, the file).

use clap::{CommandFactory, Parser};
use proptest::prelude::*;

use super::fields::KNOWN_FIELDS;
use super::{Flags, LoadedConfig, resolve_kubelet_config};

const HEADER: &str = "apiVersion: kubelet.config.k8s.io/v1beta1\nkind: KubeletConfiguration\n";

/// A YAML value of any shape: scalars that are near what a field wants (numbers, durations, quantities,
/// addresses) and far from it, lists and maps.
fn value() -> impl Strategy<Value = serde_yaml::Value> {
    let scalar = prop_oneof![
        any::<i64>().prop_map(serde_yaml::Value::from),
        any::<f64>().prop_map(serde_yaml::Value::from),
        any::<bool>().prop_map(serde_yaml::Value::from),
        Just(serde_yaml::Value::Null),
        "[0-9]{1,6}(ns|us|ms|s|m|h|Mi|Gi|%|)".prop_map(serde_yaml::Value::from),
        "-?[0-9]{1,3}(\\.[0-9]{1,3}){0,3}(:[0-9]{1,6})?".prop_map(serde_yaml::Value::from),
        "\\PC{0,20}".prop_map(serde_yaml::Value::from),
    ];
    scalar.prop_recursive(2, 8, 4, |inner| {
        prop_oneof![
            prop::collection::vec(inner.clone(), 0..4).prop_map(serde_yaml::Value::Sequence),
            prop::collection::vec(("[a-zA-Z.]{0,12}", inner), 0..4).prop_map(|kv| {
                serde_yaml::Value::Mapping(
                    kv.into_iter()
                        .map(|(k, v)| (serde_yaml::Value::from(k), v))
                        .collect(),
                )
            }),
        ]
    })
}

fn config() -> ProptestConfig {
    // bounded: a few seconds in a debug build
    ProptestConfig {
        cases: 256,
        failure_persistence: None,
        ..ProptestConfig::default()
    }
}

proptest! {
    #![proptest_config(config())]

    #[test]
    fn any_text_is_parsed_or_refused_naming_the_file(text in "\\PC{0,200}") {
        match LoadedConfig::parse(&text, "gen.yaml") {
            Ok(loaded) => {
                // resolving what parsed must not panic either
                let _ = resolve_kubelet_config(&loaded);
            }
            Err(e) => {
                let fields = e.fields();
                let said = e.to_string();
                prop_assert!(said.contains("gen.yaml") || !fields.is_empty(), "{said}");
            }
        }
    }

    #[test]
    fn a_field_of_any_value_is_taken_or_refused_by_name(
        field in prop::sample::select(KNOWN_FIELDS),
        v in value(),
    ) {
        prop_assume!(field != "apiVersion" && field != "kind");
        let mut doc = serde_yaml::Mapping::new();
        doc.insert("apiVersion".into(), "kubelet.config.k8s.io/v1beta1".into());
        doc.insert("kind".into(), "KubeletConfiguration".into());
        doc.insert(field.into(), v.clone());
        let text = serde_yaml::to_string(&doc).expect("YAML");
        let refused = LoadedConfig::parse(&text, "gen.yaml").and_then(|l| resolve_kubelet_config(&l).map(|_| ()));
        if let Err(e) = refused {
            let said = e.to_string();
            prop_assert!(
                e.fields().iter().any(|f| f.starts_with(field)) && said.contains(field),
                "{field}: {v:?} refused without naming it: {said}"
            );
        }
    }

    #[test]
    fn an_unknown_field_is_refused_by_name(field in "[a-z][a-zA-Z]{0,15}", v in value()) {
        prop_assume!(!KNOWN_FIELDS.contains(&field.as_str()) && !super::fields::ACCEPTED_WITHOUT_EFFECT.contains(&field.as_str()));
        let text = format!("{HEADER}{}", serde_yaml::to_string(&serde_yaml::Mapping::from_iter([(field.clone().into(), v)])).expect("YAML"));
        let e = LoadedConfig::parse(&text, "gen.yaml").err();
        prop_assert!(e.as_ref().is_some_and(|e| e.to_string().contains(&field)), "{field}: {e:?}");
    }

    #[test]
    fn a_flag_of_any_value_is_taken_or_refused_by_name(
        flag in prop::sample::select(value_flags()),
        v in prop_oneof!["\\PC{0,12}", "-?[0-9]{1,12}", "[0-9]{1,4}(ms|s|m|h|Mi|%)", "[a-z.]{1,8}=[0-9a-z%]{0,6}(,[a-z]{1,4}=[0-9]{0,3})?"],
    ) {
        let argv = ["node-agent".to_owned(), format!("--{flag}={v}")];
        match Flags::try_parse_from(&argv) {
            Err(e) => {
                let said = e.to_string();
                prop_assert!(said.contains(&format!("--{flag}")), "--{flag}={v:?}: {said}");
            }
            Ok(flags) => {
                if let Err(e) = flags.kubelet_config() {
                    let said = e.to_string();
                    // --config names a file: a file that cannot be read is named itself
                    let named = said.contains(&format!("--{flag}")) || (flag == "config" && said.contains(&format!("config file {v}")));
                    prop_assert!(named, "--{flag}={v:?} refused without naming it: {said}");
                }
            }
        }
    }
}

/// The long names of the flags that take a value.
fn value_flags() -> Vec<String> {
    Flags::command()
        .get_arguments()
        .filter(|a| a.get_action().takes_values())
        .filter_map(|a| a.get_long().map(str::to_owned))
        .collect()
}

#[test]
fn there_are_flags_to_generate() {
    assert!(value_flags().len() > 20, "{:?}", value_flags());
    // the parser itself is the one the binary uses
    let _ = Flags::parse_from(["node-agent"]);
}
