//! The plugin's two unix sockets as files on the node: bound so that only
//! root may connect, and at shutdown removed only while the path still
//! names the socket this instance bound.
//!
//! Without a pod UID in the names (`POD_UID` is optional outside the
//! chart), a surge replacement binds the same paths as the instance it
//! replaces: it removes the old sockets and binds its own. The old
//! instance's shutdown must then leave the new files alone; removing the
//! new registration socket by name would make kubelet deregister the
//! driver that is still running. So each bound socket keeps its identity,
//! the (device, inode) of the file, and a handle on that file (`O_PATH`),
//! which keeps the inode allocated: no later socket can get the same inode
//! number while this instance might still compare against it.

use std::fs::File;
use std::os::unix::fs::{MetadataExt, OpenOptionsExt};
use std::path::{Path, PathBuf};

use tokio::net::UnixListener;

use crate::prepare::atomic::remove_if_exists;

/// A socket file this instance bound.
#[derive(Debug)]
pub(super) struct BoundSocket {
    path: PathBuf,
    /// The file's (device, inode) when bound.
    id: (u64, u64),
    /// Pins the inode (see the module docs); never read.
    _handle: File,
}

/// What [`BoundSocket::remove_if_ours`] found at the path.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Removal {
    /// Our socket, now removed.
    Removed,
    /// Nothing there (removed already).
    Gone,
    /// Another file, a newer instance's socket: left in place.
    Replaced,
}

impl BoundSocket {
    /// Removes the socket file if the path still names the one this
    /// instance bound; a file another instance put there stays (logged).
    pub(super) fn remove_if_ours(&self) -> std::io::Result<Removal> {
        let found = match std::fs::symlink_metadata(&self.path) {
            Ok(meta) => (meta.dev(), meta.ino()),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Removal::Gone),
            Err(e) => return Err(e),
        };
        if found != self.id {
            tracing::info!(
                socket = %self.path.display(),
                "socket left in place: a newer instance of the driver has bound the same path"
            );
            return Ok(Removal::Replaced);
        }
        remove_if_exists(&self.path)?;
        Ok(Removal::Removed)
    }
}

/// Binds a unix socket that only its owner (root, like kubelet) may
/// connect to. The socket is bound under a temporary name, given mode 0600
/// and only then renamed to `path`: no client can connect through `path`
/// while the socket still has the mode the umask gave it. The temporary
/// name is random (every container is pid 1; two instances of a driver
/// bind side by side in a seamless upgrade) and no longer than `dra.sock`,
/// so it fits wherever `path` fits. The identity is taken from the
/// temporary name, which no other instance uses.
pub(super) fn bind_private(path: &Path) -> std::io::Result<(UnixListener, BoundSocket)> {
    use std::os::unix::fs::PermissionsExt;
    let mut tries = 0;
    let (listener, tmp) = loop {
        let tmp = path.with_file_name(format!(".{:06x}", rand::random::<u32>() & 0xff_ffff));
        match UnixListener::bind(&tmp) {
            Ok(listener) => break (listener, tmp),
            Err(e) if e.kind() == std::io::ErrorKind::AddrInUse && tries < 8 => tries += 1,
            Err(e) => return Err(e),
        }
    };
    let bound = std::fs::set_permissions(&tmp, std::fs::Permissions::from_mode(0o600))
        .and_then(|()| {
            std::fs::OpenOptions::new()
                .read(true)
                .custom_flags(libc::O_PATH)
                .open(&tmp)
        })
        .and_then(|handle| {
            let meta = handle.metadata()?;
            std::fs::rename(&tmp, path)?;
            Ok(BoundSocket {
                path: path.to_path_buf(),
                id: (meta.dev(), meta.ino()),
                _handle: handle,
            })
        });
    match bound {
        Ok(bound) => Ok((listener, bound)),
        Err(e) => {
            let _ = remove_if_exists(&tmp);
            Err(e)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_socket_replaced_by_another_instance_is_left_in_place() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("dra.sock");
        let (_old_listener, old) = bind_private(&path).unwrap();
        // The replacement removes the old file and binds its own.
        remove_if_exists(&path).unwrap();
        let (_new_listener, new) = bind_private(&path).unwrap();
        assert_ne!(old.id, new.id);
        assert_eq!(old.remove_if_ours().unwrap(), Removal::Replaced);
        assert!(path.exists());
        std::os::unix::net::UnixStream::connect(&path).unwrap();
        assert_eq!(new.remove_if_ours().unwrap(), Removal::Removed);
        assert!(!path.exists());
        assert_eq!(new.remove_if_ours().unwrap(), Removal::Gone);
        assert_eq!(old.remove_if_ours().unwrap(), Removal::Gone);
    }

    #[tokio::test]
    async fn a_private_socket_has_mode_0600_and_no_temporary_name_left() {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("x-reg.sock");
        let (_listener, bound) = bind_private(&path).unwrap();
        let meta = std::fs::symlink_metadata(&path).unwrap();
        assert_eq!(meta.permissions().mode() & 0o777, 0o600);
        assert_eq!((meta.dev(), meta.ino()), bound.id);
        let names: Vec<_> = std::fs::read_dir(dir.path())
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect();
        assert_eq!(names, [std::ffi::OsString::from("x-reg.sock")]);
    }
}
