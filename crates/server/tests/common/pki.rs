//! A test CA and the certificates it issues (rcgen, ECDSA P-256), written as PEM files.
#![allow(dead_code)]

use std::path::{Path, PathBuf};

use rcgen::{
    BasicConstraints, CertificateParams, CertifiedIssuer, DnType, ExtendedKeyUsagePurpose, IsCa,
    KeyPair, KeyUsagePurpose,
};

/// A CA: its certificate (PEM, also written to `<dir>/<name>-ca.pem`) and its signing key.
pub struct Ca {
    issuer: CertifiedIssuer<'static, KeyPair>,
    /// Where its certificate is.
    pub cert: PathBuf,
    dir: PathBuf,
    name: String,
}

/// A certificate and its key, as files.
#[derive(Clone, Debug)]
pub struct Issued {
    /// The certificate (PEM).
    pub cert: PathBuf,
    /// Its private key (PEM, PKCS#8).
    pub key: PathBuf,
}

impl Ca {
    /// A new CA named `name`, its certificate written to `dir`.
    pub fn new(dir: &Path, name: &str) -> Ca {
        let mut params = CertificateParams::new(Vec::<String>::new()).expect("params");
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        params.key_usages = vec![
            KeyUsagePurpose::KeyCertSign,
            KeyUsagePurpose::CrlSign,
            KeyUsagePurpose::DigitalSignature,
        ];
        params
            .distinguished_name
            .push(DnType::CommonName, format!("tollgate test CA {name}"));
        let issuer =
            CertifiedIssuer::self_signed(params, KeyPair::generate().expect("key")).expect("CA");
        let cert = dir.join(format!("{name}-ca.pem"));
        std::fs::write(&cert, issuer.pem()).expect("write CA");
        Ca {
            issuer,
            cert,
            dir: dir.to_owned(),
            name: name.to_owned(),
        }
    }

    /// A server certificate for `localhost` and 127.0.0.1, as `<dir>/<ca>-<file>.pem` / `.key`.
    pub fn server(&self, file: &str) -> Issued {
        self.issue(file, ExtendedKeyUsagePurpose::ServerAuth)
    }

    /// A client certificate (CN `client`), as `<dir>/<ca>-<file>.pem` / `.key`.
    pub fn client(&self, file: &str) -> Issued {
        self.issue(file, ExtendedKeyUsagePurpose::ClientAuth)
    }

    fn issue(&self, file: &str, usage: ExtendedKeyUsagePurpose) -> Issued {
        let mut params =
            CertificateParams::new(vec!["localhost".to_owned(), "127.0.0.1".to_owned()])
                .expect("params");
        params.distinguished_name.push(DnType::CommonName, file);
        params.key_usages = vec![KeyUsagePurpose::DigitalSignature];
        params.extended_key_usages = vec![usage];
        let key = KeyPair::generate().expect("key");
        let cert = params.signed_by(&key, &self.issuer).expect("sign");
        let issued = Issued {
            cert: self.dir.join(format!("{}-{file}.pem", self.name)),
            key: self.dir.join(format!("{}-{file}.key", self.name)),
        };
        std::fs::write(&issued.cert, cert.pem()).expect("write cert");
        std::fs::write(&issued.key, key.serialize_pem()).expect("write key");
        issued
    }
}
