//! The Go toolchain a wrapper module builds with.
//!
//! The local Go (`$AWS_DRA_GO`, `/usr/local/go/bin/go`, or `go` on `PATH`)
//! builds every module whose `go` directive it satisfies. A module that asks
//! for a newer Go (Kubernetes 1.38's go.mod says `go 1.27.0`) builds with the
//! toolchain [`GO_TOOLCHAINS`] pins for that Go minor, which the local `go`
//! fetches once from the Go module proxy (`GOTOOLCHAIN=go1.27.3 go version`:
//! the proxy serves approved toolchains as the module `golang.org/toolchain`)
//! into the cache's module directory. Each build then names that binary with
//! `GOTOOLCHAIN=local`, so nothing switches toolchains behind our back, and
//! the modules the local Go satisfies (etcd, containerd, older releases) keep
//! their stamps: a stamp records the Go version that built it.

use std::fs;
use std::path::{Path, PathBuf};
use std::process::Command;

use crate::error::{Error, Result, io};
use crate::paths::{cache_root, which};
use crate::process::run_checked;

/// The toolchain fetched for a module that needs a newer Go minor than the
/// local one: `(Go minor, exact toolchain)`. The newest patch of that minor
/// the proxy served when the entry was written.
pub const GO_TOOLCHAINS: &[(&str, &str)] = &[("1.27", "go1.27.3")];

/// A Go toolchain: the binary and what `go version` says of it.
pub struct GoToolchain {
    go: PathBuf,
    version: String,
}

impl GoToolchain {
    /// The local toolchain (`$AWS_DRA_GO`, else the usual places).
    pub fn find() -> Result<Self> {
        let go = std::env::var_os("AWS_DRA_GO")
            .map(PathBuf::from)
            .or_else(|| {
                let default = PathBuf::from("/usr/local/go/bin/go");
                default.exists().then_some(default)
            })
            .or_else(|| which("go"))
            .ok_or_else(|| Error::MissingBinary {
                what: "go toolchain (set AWS_DRA_GO)".into(),
                path: PathBuf::from("/usr/local/go/bin/go"),
            })?;
        Self::at(go)
    }

    fn at(go: PathBuf) -> Result<Self> {
        let out = run_checked(Command::new(&go).arg("version"))?;
        Ok(Self {
            go,
            version: out.trim().to_string(),
        })
    }

    /// The toolchain for the module at `module_dir`: the local one when it
    /// satisfies the module's `go` directive, else the pinned toolchain of
    /// the Go minor the module asks for, fetched through the proxy when it
    /// is not cached yet.
    pub fn for_module(module_dir: &Path) -> Result<Self> {
        let path = module_dir.join("go.mod");
        let text = fs::read_to_string(&path).map_err(io("reading", &path))?;
        Self::for_go_mod(&text, &path)
    }

    /// [`Self::for_module`] for the go.mod text `go_mod` (read from `path`).
    pub fn for_go_mod(go_mod: &str, path: &Path) -> Result<Self> {
        let local = Self::find()?;
        let Some(needed) = go_directive(go_mod) else {
            return Ok(local);
        };
        let have = local.release().ok_or_else(|| {
            Error::Host(format!("cannot read a Go version from {:?}", local.version))
        })?;
        if have >= needed {
            return Ok(local);
        }
        let minor = format!("{}.{}", needed.0, needed.1);
        let Some((_, pinned)) = GO_TOOLCHAINS.iter().find(|(m, _)| *m == minor) else {
            return Err(Error::Host(format!(
                "{} asks for Go {minor}, the local Go is {}, and no toolchain is pinned for \
                 Go {minor} in crates/local-cluster/src/go_toolchain.rs (GO_TOOLCHAINS): add \
                 one, or point AWS_DRA_GO at a Go {minor} or newer",
                path.display(),
                local.version
            )));
        };
        local.fetch(pinned)
    }

    /// `go version`'s line, e.g. `go version go1.27.3 linux/amd64`.
    pub fn version(&self) -> &str {
        &self.version
    }

    /// The release this toolchain is, as numbers.
    fn release(&self) -> Option<(u32, u32, u32)> {
        let word = self
            .version
            .split_whitespace()
            .find(|w| w.starts_with("go1"))?;
        parse_go_version(word.strip_prefix("go")?)
    }

    /// The toolchain `name` (`go1.27.3`) from the module cache, fetched by
    /// this one through the proxy when it is not there yet.
    fn fetch(&self, name: &str) -> Result<Self> {
        let dir = cache_root().join("go/mod/golang.org");
        if let Some(go) = cached_toolchain(&dir, name) {
            return Self::at(go);
        }
        // `go version` under GOTOOLCHAIN=NAME downloads NAME (checked against
        // the checksum database) and runs it: what `go` itself does when a
        // go.mod asks for a newer toolchain.
        run_checked(
            self.command(&std::env::temp_dir())
                .arg("version")
                .env("GOTOOLCHAIN", name)
                .env_remove("GOFLAGS"),
        )?;
        let go = cached_toolchain(&dir, name).ok_or_else(|| {
            Error::Host(format!(
                "GOTOOLCHAIN={name} go version ran, but no {name} appeared under {}",
                dir.display()
            ))
        })?;
        Self::at(go)
    }

    /// `go` in `module_dir` with the cache's module and build directories,
    /// reproducible paths, and no switching of toolchains.
    pub(crate) fn command(&self, module_dir: &Path) -> Command {
        let cache = cache_root().join("go");
        let mut cmd = Command::new(&self.go);
        cmd.current_dir(module_dir)
            .env("GOMODCACHE", cache.join("mod"))
            .env("GOCACHE", cache.join("build"))
            // Reproducible paths, and no VCS stamping (worktrees confuse it).
            .env("GOFLAGS", "-trimpath -buildvcs=false")
            // Never fetch another toolchain: this one was chosen for the module.
            .env("GOTOOLCHAIN", "local");
        cmd
    }
}

/// A shared hold on the Go build cache (`<cache>/go/build`), for as long as
/// a Go command that reads or writes it runs: emptying the cache
/// ([`crate::go_build::prune_build_cache`]) needs it exclusively, and
/// skips when anyone holds it, so a build beside a prune (two legs, kind
/// beside an e2e run) never loses the files it is reading.
pub struct BuildCacheHold(#[allow(dead_code)] fs::File);

/// The lock file beside the build cache (`go clean -cache` empties the
/// cache's directory, so it cannot live inside it).
fn build_cache_lock() -> Result<fs::File> {
    lock_file_in(&cache_root().join("go"))
}

fn lock_file_in(dir: &Path) -> Result<fs::File> {
    fs::create_dir_all(dir).map_err(io("creating", dir))?;
    let path = dir.join("build.lock");
    fs::OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(&path)
        .map_err(io("opening", &path))
}

/// Takes a [`BuildCacheHold`], waiting while the cache is being emptied.
pub fn hold_build_cache() -> Result<BuildCacheHold> {
    hold(build_cache_lock()?)
}

fn hold(file: fs::File) -> Result<BuildCacheHold> {
    file.lock_shared()
        .map_err(io("locking", &cache_root().join("go/build.lock")))?;
    Ok(BuildCacheHold(file))
}

/// The build cache to empty, exclusively, or `None` while a Go command
/// holds it.
pub(crate) fn try_own_build_cache() -> Result<Option<fs::File>> {
    try_own(build_cache_lock()?)
}

fn try_own(file: fs::File) -> Result<Option<fs::File>> {
    match file.try_lock() {
        Ok(()) => Ok(Some(file)),
        Err(fs::TryLockError::WouldBlock) => Ok(None),
        Err(fs::TryLockError::Error(e)) => {
            Err(io("locking", &cache_root().join("go/build.lock"))(e))
        }
    }
}

/// Where toolchain `name` (`go1.27.3`) is cached, if it has been fetched.
pub fn cached(name: &str) -> Option<PathBuf> {
    cached_toolchain(&cache_root().join("go/mod/golang.org"), name)
}

/// The `go` binary of toolchain `name` in the module cache's `golang.org`
/// directory (`toolchain@v0.0.1-go1.27.3.linux-amd64/bin/go`).
fn cached_toolchain(golang_org: &Path, name: &str) -> Option<PathBuf> {
    let prefix = format!("toolchain@v0.0.1-{name}.");
    fs::read_dir(golang_org)
        .ok()?
        .flatten()
        .filter(|e| e.file_name().to_string_lossy().starts_with(&prefix))
        .map(|e| e.path().join("bin/go"))
        .find(|go| go.is_file())
}

/// The version a go.mod's `go` directive asks for (`go 1.27.0` → 1.27.0).
pub fn go_directive(go_mod: &str) -> Option<(u32, u32, u32)> {
    go_mod.lines().find_map(|line| {
        let rest = line.trim().strip_prefix("go ")?;
        parse_go_version(rest.trim())
    })
}

/// `1.27`, `1.27.0`, `1.27rc1` (a pre-release counts as its minor's `.0`).
fn parse_go_version(text: &str) -> Option<(u32, u32, u32)> {
    let numeric = |s: &str| -> Option<u32> {
        let digits: String = s.chars().take_while(char::is_ascii_digit).collect();
        digits.parse().ok()
    };
    let mut parts = text.split('.');
    let major = numeric(parts.next()?)?;
    let minor = numeric(parts.next()?)?;
    let patch = parts.next().map_or(Some(0), numeric)?;
    Some((major, minor, patch))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_the_go_directive() {
        let k8s = "module k8s.io/kubernetes\n\ngo 1.27.0\n\ngodebug default=go1.27\n";
        assert_eq!(go_directive(k8s), Some((1, 27, 0)));
        assert_eq!(go_directive("module x\n\ngo 1.24\n"), Some((1, 24, 0)));
        assert_eq!(go_directive("module x\n"), None);
        // `godebug` and `toolchain` lines are not the directive.
        assert_eq!(
            go_directive("module x\ntoolchain go1.28.1\ngo 1.26.0\n"),
            Some((1, 26, 0))
        );
        assert_eq!(parse_go_version("1.27rc1"), Some((1, 27, 0)));
        assert_eq!(parse_go_version("1.26.8"), Some((1, 26, 8)));
        assert_eq!(parse_go_version("x"), None);
    }

    #[test]
    fn a_local_go_that_is_new_enough_is_kept() {
        let local = GoToolchain {
            go: PathBuf::from("/usr/local/go/bin/go"),
            version: "go version go1.26.8 linux/amd64".into(),
        };
        assert_eq!(local.release(), Some((1, 26, 8)));
        assert!(local.release().unwrap() >= (1, 26, 0));
        assert!(local.release().unwrap() < (1, 27, 0));
    }

    #[test]
    fn the_cache_is_emptied_only_when_no_build_holds_it() {
        let dir = tempfile::tempdir().unwrap();
        let first = hold(lock_file_in(dir.path()).unwrap()).unwrap();
        // Builds share it...
        let second = hold(lock_file_in(dir.path()).unwrap()).unwrap();
        // ...and while any holds it, nobody owns it to empty it.
        assert!(
            try_own(lock_file_in(dir.path()).unwrap())
                .unwrap()
                .is_none()
        );
        drop(first);
        assert!(
            try_own(lock_file_in(dir.path()).unwrap())
                .unwrap()
                .is_none()
        );
        drop(second);
        let owned = try_own(lock_file_in(dir.path()).unwrap()).unwrap();
        assert!(owned.is_some());
        // While it is being emptied, another owner is refused too.
        assert!(
            try_own(lock_file_in(dir.path()).unwrap())
                .unwrap()
                .is_none()
        );
    }

    #[test]
    fn finds_a_cached_toolchain_by_name() {
        let dir = tempfile::tempdir().unwrap();
        let bin = dir.path().join("toolchain@v0.0.1-go1.27.3.linux-amd64/bin");
        fs::create_dir_all(&bin).unwrap();
        fs::write(bin.join("go"), "").unwrap();
        // A toolchain whose name only starts the same is another one.
        fs::create_dir_all(
            dir.path()
                .join("toolchain@v0.0.1-go1.27.30.linux-amd64/bin"),
        )
        .unwrap();
        assert_eq!(
            cached_toolchain(dir.path(), "go1.27.3"),
            Some(bin.join("go"))
        );
        assert_eq!(cached_toolchain(dir.path(), "go1.27.2"), None);
        for (minor, pinned) in GO_TOOLCHAINS {
            assert!(pinned.starts_with(&format!("go{minor}.")), "{pinned}");
        }
    }
}
