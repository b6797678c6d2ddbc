//! A config's text: [`PolicyConfig`] read from TOML or YAML and written back as TOML, and
//! [`validate_config`], the normalized form with every default spelled out.

use crate::config::{AlgorithmKind, PolicyConfig, Storage};
use crate::config_error::{ConfigError, ConfigErrorKind};

impl PolicyConfig {
    /// Parses TOML.
    ///
    /// # Errors
    /// [`ConfigErrorKind::Parse`] with the parser's message (it names the line and field).
    pub fn from_toml(text: &str) -> Result<Self, ConfigError> {
        toml::from_str(text)
            .map_err(|e| ConfigError::new(None, "toml", ConfigErrorKind::Parse(e.to_string())))
    }

    /// Parses YAML (the same schema).
    ///
    /// # Errors
    /// [`ConfigErrorKind::Parse`] with the parser's message.
    pub fn from_yaml(text: &str) -> Result<Self, ConfigError> {
        serde_yaml_ng::from_str(text)
            .map_err(|e| ConfigError::new(None, "yaml", ConfigErrorKind::Parse(e.to_string())))
    }
}

/// The text format of a config file.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ConfigFormat {
    /// TOML.
    Toml,
    /// YAML (the same schema).
    Yaml,
}

impl ConfigFormat {
    /// YAML for a file name ending in `.yaml` / `.yml`, TOML otherwise.
    pub fn of_path(path: &std::path::Path) -> Self {
        match path.extension().and_then(|e| e.to_str()) {
            Some("yaml" | "yml") => ConfigFormat::Yaml,
            _ => ConfigFormat::Toml,
        }
    }
}

/// The policy's `check`: parses `text`, validates it as [`Policy::new`](crate::Policy::new) and
/// [`Policy::reload`](crate::Policy::reload) do ([`PolicyConfig::validate`], the one validation),
/// and returns the config as TOML with every default spelled out ([`PolicyConfig::normalized`]).
///
/// ```
/// use tollgate_policy::{ConfigFormat, validate_config};
/// let text = validate_config("[[rules]]\nname = \"g\"\nlimit = 5\nperiod = \"1s\"\n", ConfigFormat::Toml)?;
/// assert!(text.contains("burst = 5"), "{text}");
/// assert!(text.contains("algorithm = \"gcra\""), "{text}");
/// let error = validate_config("[[rules]]\nname = \"g\"\nlimit = 0\nperiod = \"1s\"\n", ConfigFormat::Toml)
///     .unwrap_err();
/// assert_eq!((error.rule.as_deref(), error.field), (Some("g"), "limit"));
/// # Ok::<(), tollgate_policy::ConfigError>(())
/// ```
///
/// # Errors
/// The [`ConfigError`] that loading the config would give, naming the rule and field.
pub fn validate_config(text: &str, format: ConfigFormat) -> Result<String, ConfigError> {
    let config = match format {
        ConfigFormat::Toml => PolicyConfig::from_toml(text)?,
        ConfigFormat::Yaml => PolicyConfig::from_yaml(text)?,
    };
    config.normalized()?.to_toml()
}

impl PolicyConfig {
    /// Validates (as [`validate`](Self::validate)) and returns the config with every default
    /// spelled out: `descriptor_match`, each rule's canonical `algorithm` name and `burst`, a
    /// striped rule's `stripes` (this machine's parallelism), each override's `burst`. Loading the
    /// result gives the same policy as loading `self`.
    ///
    /// # Errors
    /// As [`validate`](Self::validate).
    pub fn normalized(&self) -> Result<PolicyConfig, ConfigError> {
        self.validate()?;
        Ok(self.spelled_out())
    }

    /// [`normalized`](Self::normalized) for a store that keeps no in-process tables
    /// ([`validate_shared`](Self::validate_shared)).
    ///
    /// # Errors
    /// As [`validate_shared`](Self::validate_shared).
    #[cfg(feature = "redis")]
    pub fn normalized_shared(&self) -> Result<PolicyConfig, ConfigError> {
        self.validate_shared()?;
        Ok(self.spelled_out())
    }

    /// The config as TOML (the schema [`from_toml`](Self::from_toml) reads).
    ///
    /// # Errors
    /// [`ConfigErrorKind::Parse`] when the serializer refuses it (it does not for a config this
    /// crate parsed).
    pub fn to_toml(&self) -> Result<String, ConfigError> {
        toml::to_string(self)
            .map_err(|e| ConfigError::new(None, "toml", ConfigErrorKind::Parse(e.to_string())))
    }

    fn spelled_out(&self) -> PolicyConfig {
        let mut config = self.clone();
        config.descriptor_match.get_or_insert_default();
        for rule in &mut config.rules {
            if let Some(kind) = AlgorithmKind::parse(&rule.algorithm) {
                kind.name().clone_into(&mut rule.algorithm);
            }
            rule.burst.get_or_insert(rule.limit);
            if rule.storage == Storage::Striped {
                rule.stripes.get_or_insert_with(|| {
                    std::thread::available_parallelism().map_or(1, std::num::NonZeroUsize::get)
                });
            }
        }
        for o in &mut config.overrides {
            o.burst.get_or_insert(o.limit);
        }
        config
    }
}
