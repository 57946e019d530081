//! Files and folders: written never through a link, opened only if regular, the job's private folder, the
//! Python bridge carried in the binary.

pub mod bridge_files;
pub mod out_file;
pub mod runtime_dir;
pub mod untrusted_file;
