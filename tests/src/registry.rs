//! A real OCI registry for the tests: distribution/distribution ([`REGISTRY_VERSION`]), built
//! from Go modules and cached like the control-plane binaries, served on loopback with TLS (a CA
//! of its own, from [`Pki`]) and htpasswd basic auth (one user, bcrypt-hashed).
//!
//! # Guarantees
//! - [`Registry::start`] returns once the registry accepts connections; [`Registry::stop`] and
//!   [`Registry::restart`] take it away and bring it back on the same address with the same
//!   content (a registry outage mid-test).
//! - The process never outlives the test process (a [`Reaper`] of its own), and its directory
//!   (storage, certificates, logs) is removed with it.
//!
//! # Errors
//! [`Error`]: the binary cannot be found or built, a file cannot be written, the registry does
//! not come up (with the tail of its log).

use std::fs;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use base64::Engine as _;

use crate::assets::{REGISTRY_VERSION, registry_binary};
use crate::error::{Error, Result};
use crate::pki::Pki;
use crate::process::{Process, Reaper};

/// How long the registry may take to accept connections.
const READY_WITHIN: Duration = Duration::from_secs(60);

/// A running registry.
#[derive(Debug)]
pub struct Registry {
    dir: PathBuf,
    /// `127.0.0.1:<port>`: the registry part of references.
    pub host: String,
    /// The CA certificate (PEM) that signed the registry's serving certificate.
    pub ca_pem: String,
    /// The user name basic auth accepts.
    pub username: String,
    /// Its password.
    pub password: String,
    process: Process,
    reaper: Reaper,
}

impl Registry {
    /// Builds (first time only) and starts a registry in a new temporary directory.
    ///
    /// # Errors
    /// See the module docs.
    pub async fn start() -> Result<Self> {
        let binary = tokio::task::spawn_blocking(registry_binary)
            .await
            .map_err(|e| Error::Fault {
                action: "providing the registry binary".into(),
                detail: e.to_string(),
            })??;
        let dir = std::env::temp_dir().join(format!(
            "wasmop-registry-{}-{}",
            std::process::id(),
            unique()
        ));
        fs::create_dir_all(&dir).map_err(Error::io("creating", &dir))?;
        let mut reaper = Reaper::start(&dir)?;
        let pki = Pki::write(&dir.join("pki"))?;
        let ca_pem =
            fs::read_to_string(&pki.ca_cert).map_err(Error::io("reading", &pki.ca_cert))?;
        let (username, password) = ("wasmop".to_string(), format!("pw-{}", unique()));
        let hash = bcrypt::hash(&password, 5).map_err(|e| Error::Fault {
            action: "hashing the registry password".into(),
            detail: e.to_string(),
        })?;
        let htpasswd = dir.join("htpasswd");
        fs::write(&htpasswd, format!("{username}:{hash}\n"))
            .map_err(Error::io("writing", &htpasswd))?;
        let port = free_port()?;
        let host = format!("127.0.0.1:{port}");
        let config = dir.join("config.yml");
        fs::write(&config, config_yaml(&dir, &host, &pki, &htpasswd))
            .map_err(Error::io("writing", &config))?;
        // `env` clears distribution's OpenTelemetry exporter (it would dial a collector).
        let args = vec![
            "OTEL_TRACES_EXPORTER=none".to_string(),
            binary.display().to_string(),
            "serve".to_string(),
            config.display().to_string(),
        ];
        let process = Process::spawn(
            "registry",
            Path::new("/usr/bin/env"),
            &args,
            &dir,
            &mut reaper,
        )?;
        let mut registry = Registry {
            dir,
            host,
            ca_pem,
            username,
            password,
            process,
            reaper,
        };
        registry.wait_ready().await?;
        Ok(registry)
    }

    /// Takes the registry away (SIGTERM, then SIGKILL): clients get connection errors.
    pub fn stop(&mut self) {
        self.process.stop(Duration::from_secs(5));
    }

    /// Brings the registry back on the same address with the same content.
    ///
    /// # Errors
    /// See the module docs.
    pub async fn restart(&mut self) -> Result<()> {
        self.process.respawn(&mut self.reaper)?;
        self.wait_ready().await
    }

    /// A `.dockerconfigjson` document for this registry with `password` (the right one is
    /// [`Registry::password`]).
    pub fn docker_config_json(&self, password: &str) -> String {
        let auth = base64::engine::general_purpose::STANDARD
            .encode(format!("{}:{password}", self.username));
        serde_json::json!({
            "auths": { &self.host: { "username": self.username, "password": password, "auth": auth } }
        })
        .to_string()
    }

    /// The registry's log file.
    pub fn log(&self) -> PathBuf {
        self.process.log.clone()
    }

    async fn wait_ready(&mut self) -> Result<()> {
        let started = Instant::now();
        let mut last = String::from("not tried");
        while started.elapsed() < READY_WITHIN {
            self.process.check_running()?;
            match tokio::net::TcpStream::connect(&self.host).await {
                Ok(_) => return Ok(()),
                Err(e) => last = e.to_string(),
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        Err(Error::NotReady {
            what: format!("registry {REGISTRY_VERSION} on {}", self.host),
            seconds: READY_WITHIN.as_secs(),
            last,
            logs: self.dir.clone(),
        })
    }
}

fn config_yaml(dir: &Path, host: &str, pki: &Pki, htpasswd: &Path) -> String {
    format!(
        r#"version: 0.1
log:
  level: info
storage:
  filesystem:
    rootdirectory: {storage}
  delete:
    enabled: true
http:
  addr: {host}
  secret: wasmop-testenv
  tls:
    certificate: {cert}
    key: {key}
auth:
  htpasswd:
    realm: wasmop-testenv
    path: {htpasswd}
"#,
        storage = dir.join("storage").display(),
        cert = pki.server_cert.display(),
        key = pki.server_key.display(),
        htpasswd = htpasswd.display(),
    )
}

fn free_port() -> Result<u16> {
    let listener = std::net::TcpListener::bind("127.0.0.1:0")
        .map_err(Error::io("binding", Path::new("127.0.0.1:0")))?;
    let port = listener
        .local_addr()
        .map_err(Error::io("binding", Path::new("127.0.0.1:0")))?
        .port();
    Ok(port)
}

fn unique() -> u128 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos())
        .unwrap_or_default()
}

impl Drop for Registry {
    fn drop(&mut self) {
        self.stop();
    }
}
