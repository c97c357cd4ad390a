//! `--set key.path=value`: one override, parsed once where it enters — the command line (clap
//! reads it through [`FromStr`]) or a sweep's plan — and carried typed to the loaders, which apply
//! it to the document and name it in their errors.

use super::{clean_serde_message, find_tag, scalar_text, too_deep, MAX_CONFIG_BYTES, MAX_CONFIG_DEPTH};
use std::fmt;
use std::str::FromStr;

/// One override: a dotted key path and a YAML value (`4` is an integer, `[0, 2]` a list; quote a
/// string that looks like another type). Written back as `key=value`, the value as it was given.
#[derive(Debug, Clone, PartialEq)]
pub struct Override {
    key: String,
    value: serde_yaml::Value,
    /// The value as written, right of the first `=` (trimmed).
    written: String,
}

/// Why text is not an override: the key (empty where there is none) and what is allowed.
#[derive(Debug, Clone, PartialEq)]
pub struct OverrideError {
    pub key: String,
    pub allowed: String,
}

impl fmt::Display for OverrideError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.key.as_str() {
            "" => write!(f, "allowed: {}", self.allowed),
            key => write!(f, "`{key}`: allowed: {}", self.allowed),
        }
    }
}

impl std::error::Error for OverrideError {}

impl Override {
    /// Parses `key.path=value`.
    pub fn parse(text: &str) -> Result<Override, OverrideError> {
        let fail = |key: &str, allowed: String| OverrideError { key: key.to_string(), allowed };
        let (key, written) =
            text.split_once('=').ok_or_else(|| fail("", "an override of the form key.path=value".into()))?;
        let (key, written) = (key.trim(), written.trim());
        if key.is_empty() || key.split('.').any(|s| s.is_empty()) {
            return Err(fail(key, "a dotted key path such as model.depth".into()));
        }
        if written.len() > MAX_CONFIG_BYTES || too_deep(written, MAX_CONFIG_DEPTH).is_some() {
            let allowed = format!("a value of at most {MAX_CONFIG_BYTES} bytes nested at most {MAX_CONFIG_DEPTH} deep");
            return Err(fail(key, allowed));
        }
        // An integer past 64 bits as the float nearest it: the option refuses it with its range.
        let widened = super::widen_big_integers(written);
        let value: serde_yaml::Value = serde_yaml::from_str(widened.as_deref().unwrap_or(written))
            .map_err(|e| fail(key, format!("a YAML value: {}", clean_serde_message(&e.to_string()))))?;
        if let Some((_, tag)) = find_tag(&value, key) {
            return Err(fail(key, format!("a plain value: YAML tags (`{tag}`) are not part of the config schema")));
        }
        Ok(Override { key: key.to_string(), value, written: written.to_string() })
    }

    /// `key=value` from a value the code has in hand (`seed`, a grid point, `--device`).
    pub fn of(key: &str, value: impl fmt::Display) -> Result<Override, OverrideError> {
        Override::parse(&format!("{key}={value}"))
    }

    /// The dotted key path, e.g. `model.depth`.
    pub fn key(&self) -> &str {
        &self.key
    }

    /// The value, as YAML read it (null resets the key to its default).
    pub fn value(&self) -> &serde_yaml::Value {
        &self.value
    }

    /// The value as written, e.g. `0.25` or `{kind: normal, mu: 0.5}`.
    pub fn written(&self) -> &str {
        &self.written
    }

    /// Whether this override sets `key`, a key above it (`topology` for `topology.init.mu`) or a
    /// key below it: an error under `key` then comes from this override.
    pub fn touches(&self, key: &str) -> bool {
        let under = |a: &str, b: &str| a == b || a.starts_with(&format!("{b}.")) || a.starts_with(&format!("{b}["));
        !key.is_empty() && (under(key, &self.key) || under(&self.key, key))
    }

    /// The value as a short scalar text for notes, where it is one.
    pub(super) fn scalar(&self) -> Option<String> {
        scalar_text(&self.value)
    }
}

impl FromStr for Override {
    type Err = OverrideError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Override::parse(s)
    }
}

impl fmt::Display for Override {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}={}", self.key, self.written)
    }
}

/// Written as its `key=value` text (a sweep's `sweep.json` lists each run's overrides so).
impl serde::Serialize for Override {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

impl<'de> serde::Deserialize<'de> for Override {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let text = String::deserialize(d)?;
        Override::parse(&text).map_err(|e| serde::de::Error::custom(format!("--set {text}: {e}")))
    }
}

/// The overrides as they would be typed: `a=1 b=2`.
pub fn join(overrides: &[Override]) -> String {
    overrides.iter().map(Override::to_string).collect::<Vec<_>>().join(" ")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_keys_and_yaml_values_and_refuses_what_is_not_one() {
        let o = Override::parse(" model.depth = 4").unwrap();
        assert_eq!((o.key(), o.written(), o.to_string()), ("model.depth", "4", "model.depth=4".to_string()));
        assert_eq!(o.value(), &serde_yaml::Value::from(4));
        let o: Override = "topology.init={kind: normal, mu: 0.5}".parse().unwrap();
        assert_eq!(o.value().get("mu"), Some(&serde_yaml::Value::from(0.5)));
        assert_eq!(Override::parse("garbage").unwrap_err().allowed, "an override of the form key.path=value");
        assert_eq!(Override::parse("a..b=1").unwrap_err().key, "a..b");
        assert_eq!(Override::parse("=").unwrap_err().key, "");
        assert!(Override::parse("x=!tag 1").unwrap_err().allowed.contains("YAML tags"));
        assert!(Override::parse("x=[1, 2").unwrap_err().allowed.starts_with("a YAML value"));
    }

    #[test]
    fn touches_the_key_above_and_below_but_not_a_sibling() {
        let o = Override::parse("topology.init.mu=0.5").unwrap();
        assert!(o.touches("topology.init.mu") && o.touches("topology") && o.touches("topology.init.mu.x"));
        assert!(!o.touches("topology.init.sigma") && !o.touches("topology.in") && !o.touches(""));
    }

    #[test]
    fn round_trips_through_json_as_its_text() {
        let o = Override::parse("train.lr=1e-3").unwrap();
        let json = serde_json::to_string(&o).unwrap();
        assert_eq!(json, "\"train.lr=1e-3\"");
        assert_eq!(serde_json::from_str::<Override>(&json).unwrap(), o);
        assert!(serde_json::from_str::<Override>("\"nokey\"").unwrap_err().to_string().contains("--set nokey"));
    }
}
