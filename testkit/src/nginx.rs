//! nginx in front of test instances, with the deployment's own
//! configuration file (`deploy/nginx/wallet.conf`); only the listening port
//! is rewritten, so that tests can run side by side.

use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::time::Duration;

pub struct Nginx {
    pub port: u16,
    dir: PathBuf,
}

impl Nginx {
    /// Starts nginx balancing over `instances` (ports on 127.0.0.1).
    pub async fn start(instances: &[u16]) -> Self {
        let nginx = which_nginx();
        let port = crate::closed_port();
        let dir = std::env::temp_dir().join(format!("lw-nginx-{}", uuid::Uuid::new_v4().simple()));
        std::fs::create_dir_all(&dir).expect("nginx directory");
        let deploy = concat!(env!("CARGO_MANIFEST_DIR"), "/../deploy/nginx/wallet.conf");
        let site = std::fs::read_to_string(deploy).expect("deploy/nginx/wallet.conf");
        assert!(
            site.contains("listen 8080;"),
            "wallet.conf no longer listens on 8080"
        );
        let site = site.replace("listen 8080;", &format!("listen 127.0.0.1:{port};"));
        let servers: String = instances
            .iter()
            .map(|p| format!("    server 127.0.0.1:{p} max_fails=1 fail_timeout=5s;\n"))
            .collect();
        let d = dir.display();
        let user = if is_root() { "user root;" } else { "" };
        let config = format!(
            "worker_processes 1;\npid {d}/nginx.pid;\nerror_log {d}/error.log warn;\n{user}\ndaemon off;\n\
             events {{ worker_connections 1024; }}\n\
             http {{\n    access_log off;\n    client_body_temp_path {d}/body;\n    proxy_temp_path {d}/proxy;\n\
             fastcgi_temp_path {d}/fastcgi;\n    uwsgi_temp_path {d}/uwsgi;\n    scgi_temp_path {d}/scgi;\n\
             upstream wallet_instances {{\n{servers}    keepalive 32;\n}}\n{site}\n}}\n"
        );
        std::fs::write(dir.join("nginx.conf"), config).expect("nginx.conf");
        let status = Command::new(&nginx)
            .arg("-e")
            .arg(dir.join("error.log"))
            .arg("-p")
            .arg(&dir)
            .arg("-c")
            .arg(dir.join("nginx.conf"))
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("start nginx");
        drop(status);
        let client = reqwest::Client::new();
        for _ in 0..100 {
            if client
                .get(format!("http://127.0.0.1:{port}/healthz"))
                .send()
                .await
                .is_ok_and(|r| r.status() == 200)
            {
                return Self { port, dir };
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        let log = std::fs::read_to_string(dir.join("error.log")).unwrap_or_default();
        panic!("nginx did not come up:\n{log}");
    }

    pub fn url(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }
}

impl Drop for Nginx {
    fn drop(&mut self) {
        if let Ok(pid) = std::fs::read_to_string(self.dir.join("nginx.pid")) {
            let _ = Command::new("kill").arg(pid.trim()).status();
        }
    }
}

fn which_nginx() -> PathBuf {
    for candidate in ["/usr/sbin/nginx", "/usr/bin/nginx"] {
        if std::path::Path::new(candidate).exists() {
            return candidate.into();
        }
    }
    panic!("nginx is not installed: apt-get install nginx-light (./scripts/test does this)");
}

fn is_root() -> bool {
    Command::new("id")
        .arg("-u")
        .output()
        .is_ok_and(|out| out.stdout.starts_with(b"0"))
}
