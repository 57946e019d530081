//! Who the job and its processes are, as the series and the status name them: the job's labels (its name from
//! the launcher, the GPUs `CUDA_VISIBLE_DEVICES` names) and a process's command as `top` shows it.

/// Who the job is, for the `job` and `host` labels, and what is known of its devices.
#[derive(Clone, Debug, Default)]
pub struct JobLabels {
    pub job: String,
    pub host: String,
    /// Device ordinal -> UUID, where known (`CUDA_VISIBLE_DEVICES` naming GPUs by UUID).
    pub uuids: Vec<String>,
    /// Per-process series carry a `pid` label (`--metrics-pids`). Off by default: whoever reaches the port (any
    /// local user, on loopback) would learn the job's pids; without it a process's series are its rank's.
    pub pids: bool,
}

impl JobLabels {
    pub(super) fn uuid(&self, device: u32) -> &str {
        self.uuids.get(device as usize).map_or("", String::as_str)
    }
}

/// The job's name for the `job` label and the trace header: `--job-name`, else the launcher's job id
/// (Slurm, torchrun, PBS, LSF, Grid Engine, Flux, Kubernetes Jobs), with where it came from.
pub fn job_name(given: Option<&str>) -> Option<(String, &'static str)> {
    if let Some(g) = given.map(str::trim).filter(|g| !g.is_empty()) {
        return Some((g.to_string(), "--job-name"));
    }
    const VARS: [&str; 8] = [
        "SLURM_JOB_ID",
        "TORCHELASTIC_RUN_ID",
        "PBS_JOBID",
        "LSB_JOBID",
        "FLUX_JOB_ID",
        "JOB_ID",
        "VRAMTRACE_JOB",
        "JOB_NAME",
    ];
    VARS.iter().find_map(|v| {
        std::env::var(v)
            .ok()
            .map(|s| s.trim().to_string())
            .filter(|s| !s.is_empty())
            .map(|s| (s, *v))
    })
}

/// GPU UUIDs by CUDA ordinal, where `CUDA_VISIBLE_DEVICES` names the GPUs by UUID (`GPU-...`, `MIG-...`); empty
/// otherwise (the trace does not record UUIDs).
pub fn uuids_from_env() -> Vec<String> {
    let Ok(v) = std::env::var("CUDA_VISIBLE_DEVICES") else {
        return Vec::new();
    };
    let ids: Vec<String> = v.split(',').map(|s| s.trim().to_string()).collect();
    if ids
        .iter()
        .all(|s| s.starts_with("GPU-") || s.starts_with("MIG-"))
    {
        ids
    } else {
        Vec::new()
    }
}

/// What `top` and `/status.json` call a process: its program's name (a path's last part: the path's
/// directories say nothing a reader needs, and a long one would hide the script) and its arguments, at most 256
/// characters. The program's own words: printed through `units::printable`.
pub(super) fn command_line(argv: &[String]) -> String {
    let mut words = argv.iter();
    let Some(first) = words.next() else {
        return String::new();
    };
    let mut out = first.rsplit('/').next().unwrap_or(first).to_string();
    for w in words {
        if out.chars().count() >= 256 {
            break;
        }
        out.push(' ');
        out.push_str(w);
    }
    out.chars().take(256).collect()
}
