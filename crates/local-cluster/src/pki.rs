//! Certificates and kubeconfigs of one local cluster.
//!
//! One CA signs everything (like local-up-cluster with a single CA signer):
//! the apiserver and kubelet serving certificates and every client identity.
//! Keys are ECDSA P-256 (what rcgen's ring backend generates); the apiserver
//! accepts EC keys for service-account token signing too. Certificates live
//! in the run directory with the logs; nothing outside it is touched.

use std::fs;
use std::net::IpAddr;
use std::path::{Path, PathBuf};

use rcgen::{
    BasicConstraints, CertificateParams, DistinguishedName, DnType, ExtendedKeyUsagePurpose, IsCa,
    Issuer, KeyPair, KeyUsagePurpose, SanType,
};
use serde_json::json;

use crate::error::{Error, Result, io};

/// The cluster CA, kept in memory to sign more identities later.
pub struct ClusterCa {
    dir: PathBuf,
    issuer: Issuer<'static, KeyPair>,
    /// PEM file of the CA certificate (the `--client-ca-file` and every client's trust root).
    pub cert_file: PathBuf,
    pub key_file: PathBuf,
}

/// A certificate and its key on disk.
#[derive(Debug, Clone)]
pub struct CertPair {
    pub cert_file: PathBuf,
    pub key_file: PathBuf,
}

/// The service-account signing key pair on disk.
#[derive(Debug, Clone)]
pub struct ServiceAccountKey {
    pub private_key_file: PathBuf,
    pub public_key_file: PathBuf,
}

fn cert_err(name: &str) -> impl FnOnce(rcgen::Error) -> Error + '_ {
    move |source| Error::Certificate {
        name: name.to_string(),
        source,
    }
}

fn write_secret(path: &Path, contents: &str) -> Result<()> {
    use std::os::unix::fs::PermissionsExt;
    fs::write(path, contents).map_err(io("writing", path))?;
    fs::set_permissions(path, fs::Permissions::from_mode(0o600)).map_err(io("chmod", path))
}

impl ClusterCa {
    /// Creates a fresh CA in `dir` (created if missing).
    pub fn create(dir: &Path) -> Result<Self> {
        fs::create_dir_all(dir).map_err(io("creating", dir))?;
        let key = KeyPair::generate().map_err(cert_err("ca"))?;
        let mut params = CertificateParams::default();
        params.distinguished_name = DistinguishedName::new();
        params
            .distinguished_name
            .push(DnType::CommonName, "aws-dra-e2e-ca");
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        params.key_usages = vec![
            KeyUsagePurpose::KeyCertSign,
            KeyUsagePurpose::CrlSign,
            KeyUsagePurpose::DigitalSignature,
        ];
        let cert = params.self_signed(&key).map_err(cert_err("ca"))?;
        let cert_file = dir.join("ca.crt");
        let key_file = dir.join("ca.key");
        fs::write(&cert_file, cert.pem()).map_err(io("writing", &cert_file))?;
        write_secret(&key_file, &key.serialize_pem())?;
        Ok(Self {
            dir: dir.to_path_buf(),
            issuer: Issuer::new(params, key),
            cert_file,
            key_file,
        })
    }

    fn sign(
        &self,
        file_stem: &str,
        common_name: &str,
        organizations: &[&str],
        sans: &[SanType],
        usage: ExtendedKeyUsagePurpose,
    ) -> Result<CertPair> {
        let key = KeyPair::generate().map_err(cert_err(file_stem))?;
        let mut params = CertificateParams::default();
        params.distinguished_name = DistinguishedName::new();
        params
            .distinguished_name
            .push(DnType::CommonName, common_name);
        for org in organizations {
            params
                .distinguished_name
                .push(DnType::OrganizationName, *org);
        }
        params.subject_alt_names = sans.to_vec();
        params.key_usages = vec![
            KeyUsagePurpose::DigitalSignature,
            KeyUsagePurpose::KeyEncipherment,
        ];
        params.extended_key_usages = vec![usage];
        params.use_authority_key_identifier_extension = true;
        let cert = params
            .signed_by(&key, &self.issuer)
            .map_err(cert_err(file_stem))?;
        let pair = CertPair {
            cert_file: self.dir.join(format!("{file_stem}.crt")),
            key_file: self.dir.join(format!("{file_stem}.key")),
        };
        fs::write(&pair.cert_file, cert.pem()).map_err(io("writing", &pair.cert_file))?;
        write_secret(&pair.key_file, &key.serialize_pem())?;
        Ok(pair)
    }

    /// A client certificate: CN is the user name, O the groups.
    pub fn client_cert(&self, file_stem: &str, user: &str, groups: &[&str]) -> Result<CertPair> {
        self.sign(
            file_stem,
            user,
            groups,
            &[],
            ExtendedKeyUsagePurpose::ClientAuth,
        )
    }

    /// A serving certificate for the given DNS names and IP addresses.
    pub fn serving_cert(
        &self,
        file_stem: &str,
        common_name: &str,
        dns_names: &[&str],
        ips: &[IpAddr],
    ) -> Result<CertPair> {
        let mut sans = Vec::new();
        for name in dns_names {
            let ia5 = (*name).try_into().map_err(cert_err(file_stem))?;
            sans.push(SanType::DnsName(ia5));
        }
        sans.extend(ips.iter().map(|ip| SanType::IpAddress(*ip)));
        self.sign(
            file_stem,
            common_name,
            &[],
            &sans,
            ExtendedKeyUsagePurpose::ServerAuth,
        )
    }

    /// The key the apiserver signs service-account tokens with (and the
    /// controller-manager signs the tokens it mints).
    pub fn service_account_key(&self) -> Result<ServiceAccountKey> {
        let key = KeyPair::generate().map_err(cert_err("service-account"))?;
        let out = ServiceAccountKey {
            private_key_file: self.dir.join("service-account.key"),
            public_key_file: self.dir.join("service-account.pub"),
        };
        write_secret(&out.private_key_file, &key.serialize_pem())?;
        fs::write(&out.public_key_file, key.public_key_pem())
            .map_err(io("writing", &out.public_key_file))?;
        Ok(out)
    }
}

/// How a kubeconfig authenticates.
pub enum Credentials<'a> {
    ClientCert(&'a CertPair),
    Token(&'a str),
}

/// Writes a self-contained kubeconfig (JSON, which every kubeconfig reader
/// accepts as YAML) for `server` trusting `ca_file`.
pub fn write_kubeconfig(
    path: &Path,
    server: &str,
    ca_file: &Path,
    user: &str,
    credentials: Credentials<'_>,
) -> Result<()> {
    let user_entry = match credentials {
        Credentials::ClientCert(pair) => json!({
            "client-certificate": pair.cert_file,
            "client-key": pair.key_file,
        }),
        Credentials::Token(token) => json!({ "token": token }),
    };
    let config = json!({
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": "aws-dra-e2e", "cluster": {
            "server": server,
            "certificate-authority": ca_file,
        }}],
        "users": [{"name": user, "user": user_entry}],
        "contexts": [{"name": "aws-dra-e2e", "context": {"cluster": "aws-dra-e2e", "user": user}}],
        "current-context": "aws-dra-e2e",
    });
    let text = serde_json::to_string_pretty(&config).map_err(|source| Error::Json {
        what: format!("kubeconfig {}", path.display()),
        source,
    })?;
    write_secret(path, &text)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn issues_client_and_serving_certs() {
        let dir = tempfile::tempdir().unwrap();
        let ca = ClusterCa::create(dir.path()).unwrap();
        let node = ca
            .client_cert("node-p5", "system:node:p5", &["system:nodes"])
            .unwrap();
        let serving = ca
            .serving_cert(
                "apiserver",
                "kube-apiserver",
                &["localhost", "kubernetes.default.svc"],
                &["127.0.0.1".parse().unwrap()],
            )
            .unwrap();
        for pair in [&node, &serving] {
            let pem = fs::read_to_string(&pair.cert_file).unwrap();
            assert!(pem.starts_with("-----BEGIN CERTIFICATE-----"));
            let key = fs::read_to_string(&pair.key_file).unwrap();
            assert!(key.contains("PRIVATE KEY"));
        }
        let sa = ca.service_account_key().unwrap();
        assert!(
            fs::read_to_string(&sa.public_key_file)
                .unwrap()
                .contains("PUBLIC KEY")
        );

        let kubeconfig = dir.path().join("node.kubeconfig");
        write_kubeconfig(
            &kubeconfig,
            "https://127.0.0.1:6443",
            &ca.cert_file,
            "system:node:p5",
            Credentials::ClientCert(&node),
        )
        .unwrap();
        let parsed: serde_json::Value =
            serde_json::from_str(&fs::read_to_string(&kubeconfig).unwrap()).unwrap();
        assert_eq!(
            parsed["clusters"][0]["cluster"]["server"],
            "https://127.0.0.1:6443"
        );
        assert_eq!(parsed["current-context"], "aws-dra-e2e");
    }
}
