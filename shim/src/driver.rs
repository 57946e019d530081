//! Finding the real driver, and handing out wrappers in its place.
//!
//! Programs reach the driver through three doors (../shared/CUDA-NOTES.md): symbols bound at link time (our
//! exports win, being preloaded), `dlsym` on a libcuda handle, and `cuGetProcAddress`. Each tracked function has
//! a slot holding the real driver's address; the wrapper calls through it. Slots are filled by whichever door
//! shows us the real address first, and all at once from the driver's own handle (`bind`), so that the
//! pointers `cuGetProcAddress` returns can be recognised by identity and swapped for the matching wrapper.

use std::ffi::{c_char, c_int, c_void, CStr};
use std::ptr::null_mut;
use std::sync::atomic::{AtomicBool, AtomicPtr, AtomicU32, Ordering};

/// Builds this file's half of the list: `Sym`, `ALL`, `NAMES`, `WRAPPED` (the export each wrapped function has
/// is exports.rs's half: `wrapper`).
macro_rules! declare_driver_functions {
    (
        wrapped { $( $(#[$wm:meta])* $w:ident = $wname:literal => $wfn:ident, )* }
        called { $( $(#[$cm:meta])* $c:ident = $cname:literal, )* }
    ) => {
        /// The driver functions (symbols) the shim knows: the wrapped ones first, then those it only calls. The
        /// `Nvml*` ones live in NVML (`libnvidia-ml.so.1`), not in the driver: `bind` leaves them alone and
        /// `real_nvml` finds them.
        #[derive(Clone, Copy, Debug, PartialEq, Eq)]
        #[repr(usize)]
        pub enum Sym {
            $( $(#[$wm])* $w, )*
            $( $(#[$cm])* $c, )*
        }

        const ALL: [Sym; COUNT] = [$( Sym::$w, )* $( Sym::$c, )*];
        const COUNT: usize = [$( stringify!($w), )* $( stringify!($c), )*].len();
        /// The wrapped ones are `ALL[..WRAPPED]`.
        const WRAPPED: usize = [$( stringify!($w), )*].len();

        /// The exact exported names (the driver's, and NVML's), in `Sym` order.
        const NAMES: [&CStr; COUNT] = [$( $wname, )* $( $cname, )*];
    };
}

/// The shim's own function standing in for a driver function (exports.rs's `wrapper`), or null for one it only
/// calls. The resolving here takes it as an argument: it must know our wrappers to route lookups to them, and
/// the exports, above it, are what calls it.
pub type Wrapper = fn(Sym) -> *mut c_void;

/// The one list of driver functions, in the spirit of memray's `FOR_EACH_HOOKED_FUNCTION`: each one's `Sym`,
/// its exact exported name, and, for those the shim wraps, the export (exports.rs) standing in for it. It hands
/// the list to `$then!`: here `declare_driver_functions!`, in exports.rs `declare_wrappers!`, so the two halves
/// cannot fall out of step (a test checks each wrapper's own symbol name against its name).
macro_rules! for_each_driver_function {
    ($then:ident) => {
        $then! {
    wrapped {
        MemAlloc = c"cuMemAlloc_v2" => cuMemAlloc_v2,
        MemAllocPitch = c"cuMemAllocPitch_v2" => cuMemAllocPitch_v2,
        MemAllocManaged = c"cuMemAllocManaged" => cuMemAllocManaged,
        MemFree = c"cuMemFree_v2" => cuMemFree_v2,
        MemAllocAsync = c"cuMemAllocAsync" => cuMemAllocAsync,
        MemAllocAsyncPtsz = c"cuMemAllocAsync_ptsz" => cuMemAllocAsync_ptsz,
        MemAllocFromPoolAsync = c"cuMemAllocFromPoolAsync" => cuMemAllocFromPoolAsync,
        MemAllocFromPoolAsyncPtsz = c"cuMemAllocFromPoolAsync_ptsz" => cuMemAllocFromPoolAsync_ptsz,
        MemFreeAsync = c"cuMemFreeAsync" => cuMemFreeAsync,
        MemFreeAsyncPtsz = c"cuMemFreeAsync_ptsz" => cuMemFreeAsync_ptsz,
        MemCreate = c"cuMemCreate" => cuMemCreate,
        MemRelease = c"cuMemRelease" => cuMemRelease,
        MemMap = c"cuMemMap" => cuMemMap,
        MemUnmap = c"cuMemUnmap" => cuMemUnmap,
        MemAddressReserve = c"cuMemAddressReserve" => cuMemAddressReserve,
        MemAddressFree = c"cuMemAddressFree" => cuMemAddressFree,
        MemGetInfo = c"cuMemGetInfo_v2" => cuMemGetInfo_v2,
        DeviceTotalMem = c"cuDeviceTotalMem_v2" => cuDeviceTotalMem_v2,
        GetProcAddress = c"cuGetProcAddress" => cuGetProcAddress,
        GetProcAddressV2 = c"cuGetProcAddress_v2" => cuGetProcAddress_v2,
        NvmlMemoryInfo = c"nvmlDeviceGetMemoryInfo" => nvmlDeviceGetMemoryInfo,
        NvmlMemoryInfoV2 = c"nvmlDeviceGetMemoryInfo_v2" => nvmlDeviceGetMemoryInfo_v2,
        CtxCreate = c"cuCtxCreate_v2" => cuCtxCreate_v2,
        CtxCreateV3 = c"cuCtxCreate_v3" => cuCtxCreate_v3,
        CtxCreateV4 = c"cuCtxCreate_v4" => cuCtxCreate_v4,
        CtxDestroy = c"cuCtxDestroy_v2" => cuCtxDestroy_v2,
        PrimaryCtxReset = c"cuDevicePrimaryCtxReset_v2" => cuDevicePrimaryCtxReset_v2,
        PrimaryCtxRelease = c"cuDevicePrimaryCtxRelease_v2" => cuDevicePrimaryCtxRelease_v2,
        /// The legacy (CUDA 7.0 ABI) `cuDevicePrimaryCtxReset`/`Release`: `cuGetProcAddress` answers them to a
        /// caller asking for that version (PyTorch 2.11 asks for `cuDevicePrimaryCtxRelease` at 7000).
        PrimaryCtxResetV1 = c"cuDevicePrimaryCtxReset" => cuDevicePrimaryCtxReset,
        PrimaryCtxReleaseV1 = c"cuDevicePrimaryCtxRelease" => cuDevicePrimaryCtxRelease,
    }
    called {
        CtxGetDevice = c"cuCtxGetDevice",
        DeviceGet = c"cuDeviceGet",
        DeviceGetCount = c"cuDeviceGetCount",
        DeviceGetUuidV2 = c"cuDeviceGetUuid_v2",
        DeviceGetMemPool = c"cuDeviceGetMemPool",
        MemPoolGetAttribute = c"cuMemPoolGetAttribute",
        NvmlDeviceGetUuid = c"nvmlDeviceGetUUID",
        CtxPushCurrent = c"cuCtxPushCurrent_v2",
        CtxPopCurrent = c"cuCtxPopCurrent_v2",
        PrimaryCtxGetState = c"cuDevicePrimaryCtxGetState",
    }
        }
    };
}
pub(crate) use for_each_driver_function;

for_each_driver_function!(declare_driver_functions);

#[allow(clippy::declare_interior_mutable_const)]
const EMPTY: AtomicPtr<c_void> = AtomicPtr::new(null_mut());
#[link_section = ".vramtrace.hotdata"]
static REAL: [AtomicPtr<c_void>; COUNT] = [EMPTY; COUNT];
static BOUND: AtomicBool = AtomicBool::new(false);
/// The one device of a process that sees exactly one (`cuDeviceGetCount` said 1): every context it can make is
/// on it. `NO_DEVICE` until the devices are first read (`devices`), and for ever where there are several.
#[link_section = ".vramtrace.hotdata"]
static ONLY_DEVICE: AtomicU32 = AtomicU32::new(vramtrace_format::NO_DEVICE);

impl Sym {
    pub fn name(self) -> &'static CStr {
        NAMES[self as usize]
    }

    /// Whether this is an NVML function (found in NVML's library, not the driver's).
    pub fn is_nvml(self) -> bool {
        matches!(
            self,
            Sym::NvmlMemoryInfo | Sym::NvmlMemoryInfoV2 | Sym::NvmlDeviceGetUuid
        )
    }
}

/// The wrapped function with this exact name, if any. No allocation, no lock: it runs inside every `dlsym`.
fn tracked(symbol: *const c_char) -> Option<Sym> {
    if symbol.is_null() {
        return None;
    }
    // Cheap rejection first: every tracked name starts with "cu" or "nvml". Each byte is read only when the ones
    // before it matched (so none past the terminating NUL).
    // SAFETY: `symbol` is non-null and, by dlsym's contract, a NUL-terminated name; `at(i)` is only reached when
    // bytes 0..i matched letters (not NUL), so it never reads past the terminator.
    let at = |i: usize| unsafe { *symbol.add(i) as u8 };
    let cu = at(0) == b'c' && at(1) == b'u';
    let nvml = at(0) == b'n' && at(1) == b'v' && at(2) == b'm' && at(3) == b'l';
    if !(cu || nvml) {
        return None;
    }
    // SAFETY: `symbol` is non-null and NUL-terminated (dlsym's contract), and the caller's string outlives this
    // call; `name` does not escape it.
    let name = unsafe { CStr::from_ptr(symbol) };
    ALL[..WRAPPED]
        .iter()
        .copied()
        .find(|f| NAMES[*f as usize] == name)
}

// ---- the real dlsym --------------------------------------------------------------------------------------

pub type DlsymFn = unsafe extern "C" fn(*mut c_void, *const c_char) -> *mut c_void;

static REAL_DLSYM: AtomicPtr<c_void> = AtomicPtr::new(null_mut());

/// The next `dlsym` after the shim: the one `RTLD_NEXT` finds from inside it. That is glibc's, unless another
/// interposer of `dlsym` was preloaded after us (HAMi-core's `libvgpu.so`, a profiler): then it is theirs, so
/// their hooks keep applying to lookups that pass through us. Found by asking glibc's own `dlsym` (reached with
/// `dlvsym`, since a plain `dlsym` from here would land in our own export) for `RTLD_NEXT`'s "dlsym": glibc
/// resolves `RTLD_NEXT` from its caller, which is this library. `__libc_dlsym` and `_dl_sym` are gone since
/// glibc 2.34.
pub fn real_dlsym() -> Option<DlsymFn> {
    let mut p = REAL_DLSYM.load(Ordering::Acquire);
    if p.is_null() {
        let glibc = glibc_dlsym()?;
        p = next_dlsym(glibc);
        if p.is_null() || in_this_library(p) {
            p = glibc as *mut c_void;
        }
        REAL_DLSYM.store(p, Ordering::Release);
    }
    // SAFETY: `p` is non-null and is a `dlsym` (glibc's, found by `dlvsym`, or the next interposer's, found under
    // the name "dlsym"): a function with `DlsymFn`'s prototype.
    Some(unsafe { std::mem::transmute::<*mut c_void, DlsymFn>(p) })
}

static GLIBC_DLSYM: AtomicPtr<c_void> = AtomicPtr::new(null_mut());

/// glibc's own `dlsym` (reached with `dlvsym`: a plain `dlsym` from here would land in our own export). Called
/// from this library with `RTLD_NEXT`, it finds the definition after the shim, whoever else interposes `dlsym`.
pub fn glibc_dlsym() -> Option<DlsymFn> {
    let mut p = GLIBC_DLSYM.load(Ordering::Acquire);
    if p.is_null() {
        for version in [c"GLIBC_2.34", c"GLIBC_2.2.5", c"GLIBC_2.17"] {
            // SAFETY: both names are NUL-terminated literals; `RTLD_NEXT` is a valid pseudo-handle from inside a
            // loaded object.
            p = unsafe { libc::dlvsym(libc::RTLD_NEXT, c"dlsym".as_ptr(), version.as_ptr()) };
            if !p.is_null() {
                break;
            }
        }
        if p.is_null() {
            return None;
        }
        GLIBC_DLSYM.store(p, Ordering::Release);
    }
    // SAFETY: `p` is non-null and is a `dlsym` (glibc's, found by `dlvsym`, or the next interposer's, found under
    // the name "dlsym"): a function with `DlsymFn`'s prototype.
    Some(unsafe { std::mem::transmute::<*mut c_void, DlsymFn>(p) })
}

/// `glibc(RTLD_NEXT, "dlsym")`, called from here so that "next" means after this library. Not inlined into a
/// caller elsewhere: the return address glibc reads must be this library's.
#[inline(never)]
fn next_dlsym(glibc: DlsymFn) -> *mut c_void {
    // SAFETY: `glibc` is glibc's own dlsym (`glibc_dlsym`); the name is a NUL-terminated literal, and RTLD_NEXT
    // is valid from inside this library.
    unsafe { glibc(libc::RTLD_NEXT, c"dlsym".as_ptr()) }
}

/// Called by the `dlsym` trampoline (exports.rs) for every `dlsym` in the process. Returns the real `dlsym` when
/// the call should go straight to it, with the caller's own return address so glibc resolves `RTLD_NEXT` and
/// `RTLD_DEFAULT` from the caller's scope, exactly as without us; returns null when `dlsym_hook` must answer.
/// `RTLD_NEXT` lookups always pass through: they come from other interposers, whose chain we leave alone.
pub unsafe extern "C" fn dlsym_route(handle: *mut c_void, symbol: *const c_char) -> *mut c_void {
    if handle != libc::RTLD_NEXT && tracked(symbol).is_some() {
        return null_mut();
    }
    real_dlsym().map_or(null_mut(), |f| f as *mut c_void)
}

/// A `dlsym` of a tracked name: the real lookup, with the caller's handle, then our wrapper in place of the
/// driver's function. Nothing is allocated or locked here.
pub unsafe fn dlsym_hook(
    handle: *mut c_void,
    symbol: *const c_char,
    wrapper: Wrapper,
) -> *mut c_void {
    let Some(real) = real_dlsym() else {
        return null_mut();
    };
    let mut p = real(handle, symbol);
    let Some(f) = tracked(symbol) else {
        return p;
    };
    // A driver loaded into a link-map namespace of its own (`dlmopen(LM_ID_NEWLM)`) is another copy of it, with
    // its own state: its functions are not ours to wrap (the wrappers would call the first namespace's copy for
    // what they need, uninitialised there, and crash the program). Left alone; the cap's GPU check sees it.
    if !in_base_namespace(handle) {
        return p;
    }
    if p == wrapper(f) {
        // The lookup found our own export (`RTLD_DEFAULT`, or the program's global scope): the driver's is the
        // next definition after us, if the driver is there at all. Without one the answer is null, as it
        // would be without the shim (programs probe for the driver this way).
        p = real(libc::RTLD_NEXT, symbol);
    }
    if p.is_null() {
        return p;
    }
    adopt(f, p, wrapper(f))
}

/// Whether a `dlsym` handle names an object of the first link-map namespace (the one the shim is preloaded
/// into). The special handles are the caller's scope: ours. Unknown (dlinfo refused it): as before, ours.
fn in_base_namespace(handle: *mut c_void) -> bool {
    if handle.is_null() || handle == libc::RTLD_NEXT {
        return true;
    }
    let mut lmid: libc::Lmid_t = libc::LM_ID_BASE;
    // SAFETY: `handle` is the program's own `dlsym` handle, which glibc's `dlsym` has just read as a link map
    // (the caller looked the symbol up with it first); `lmid` is a local `Lmid_t`, as RTLD_DI_LMID writes.
    let r = unsafe {
        libc::dlinfo(
            handle,
            libc::RTLD_DI_LMID,
            (&mut lmid as *mut libc::Lmid_t).cast(),
        )
    };
    r != 0 || lmid == libc::LM_ID_BASE
}

/// `p` is what the driver answered for `f`. Remember it as the real function and return the wrapper `w`, unless
/// the slot already holds a different function (another library exporting the same name: left alone).
fn adopt(f: Sym, p: *mut c_void, w: *mut c_void) -> *mut c_void {
    if p == w {
        return p;
    }
    let slot = &REAL[f as usize];
    let _ = slot.compare_exchange(null_mut(), p, Ordering::AcqRel, Ordering::Acquire);
    if slot.load(Ordering::Acquire) == p {
        w
    } else {
        p
    }
}

// ---- the real functions ----------------------------------------------------------------------------------

/// The real driver's `f`, finding the driver first if no door has shown it yet. Null if there is no driver.
#[inline]
#[link_section = ".vramtrace.hot"]
pub fn real(f: Sym) -> *mut c_void {
    let p = REAL[f as usize].load(Ordering::Acquire);
    if !p.is_null() {
        return p;
    }
    bind(null_mut());
    REAL[f as usize].load(Ordering::Acquire)
}

/// A library whose functions fill a group of slots: the driver, or NVML.
struct Library {
    /// Which slots: `Sym::is_nvml` equal to this.
    nvml: bool,
    /// A function it exports, to find it in the global scope (a program linked with it).
    probe: Sym,
    /// Its soname, to find it already loaded.
    soname: &'static CStr,
    name: &'static str,
}

const DRIVER: Library = Library {
    nvml: false,
    probe: Sym::GetProcAddress,
    soname: c"libcuda.so.1",
    name: "the driver",
};

const NVML: Library = Library {
    nvml: true,
    probe: Sym::NvmlMemoryInfo,
    soname: c"libnvidia-ml.so.1",
    name: "NVML",
};

/// Fills every slot of `lib` from the library's own handle. `anchor` is any address inside it, or null to
/// find it: a slot of its group some door already filled, the next definition of its probe function after us
/// in the global scope (a program linked with it), or an already-loaded copy by soname. Never loads the library
/// itself. Returns whether the library was found.
fn bind_library(lib: &Library, anchor: *mut c_void) -> bool {
    let Some(real_dlsym) = real_dlsym() else {
        return false;
    };
    let mut anchor = anchor;
    if anchor.is_null() {
        // The other group's slots point into another library: never an anchor for this one.
        anchor = ALL
            .iter()
            .filter(|f| f.is_nvml() == lib.nvml)
            .map(|f| REAL[*f as usize].load(Ordering::Acquire))
            .find(|p| !p.is_null())
            .unwrap_or(null_mut());
    }
    if anchor.is_null() {
        // SAFETY: `real_dlsym` is a dlsym (`DlsymFn`); the name is a NUL-terminated `&'static CStr`, and
        // RTLD_NEXT is valid from inside this library.
        anchor = unsafe { real_dlsym(libc::RTLD_NEXT, lib.probe.name().as_ptr()) };
    }
    // SAFETY: the sonames are NUL-terminated literals, and RTLD_NOLOAD never loads (so runs no constructor).
    // `Dl_info` is pointers and integers, valid all zero; `dladdr` fills it for any address (it returns 0 for one
    // in no object). A non-null `dli_fname` names an object that is loaded, since `anchor` lies in it.
    let handle = unsafe {
        if anchor.is_null() {
            libc::dlopen(lib.soname.as_ptr(), libc::RTLD_LAZY | libc::RTLD_NOLOAD)
        } else {
            let mut info: libc::Dl_info = std::mem::zeroed();
            if libc::dladdr(anchor, &mut info) == 0 || info.dli_fname.is_null() {
                return false;
            }
            libc::dlopen(info.dli_fname, libc::RTLD_LAZY | libc::RTLD_NOLOAD)
        }
    };
    if handle.is_null() {
        return false;
    }
    for f in ALL.into_iter().filter(|f| f.is_nvml() == lib.nvml) {
        // SAFETY: `handle` is a live handle from the dlopen above; the name is a NUL-terminated `&'static CStr`.
        let p = unsafe { real_dlsym(handle, f.name().as_ptr()) };
        if !p.is_null() && !in_this_library(p) {
            let _ = REAL[f as usize].compare_exchange(
                null_mut(),
                p,
                Ordering::AcqRel,
                Ordering::Acquire,
            );
        }
    }
    // SAFETY: drops the reference our RTLD_NOLOAD dlopen took, once; the library stays loaded by whoever loaded
    // it, so the addresses kept in `REAL` stay valid.
    unsafe { libc::dlclose(handle) };
    crate::debug!("bound {}'s functions", lib.name);
    true
}

/// Whether `p` lies in this library (one of our own exports, never to be taken for the driver's function).
/// Cold: once per function at binding.
#[cold]
pub(crate) fn in_this_library(p: *mut c_void) -> bool {
    // SAFETY: `Dl_info` is pointers and integers, valid all zero; `dladdr` only reads the loader's tables for
    // the two addresses (0 for one in no object), and `in_this_library` is a function of this library.
    unsafe {
        let (mut theirs, mut ours) = (std::mem::zeroed::<libc::Dl_info>(), std::mem::zeroed());
        libc::dladdr(p, &mut theirs) != 0
            && libc::dladdr(in_this_library as *const c_void, &mut ours) != 0
            && theirs.dli_fbase == ours.dli_fbase
    }
}

/// Fills every driver slot from the driver's own handle (see `bind_library`); `anchor` is any address inside
/// the driver, or null to find it.
#[cold]
pub fn bind(anchor: *mut c_void) {
    if !BOUND.load(Ordering::Acquire) && bind_library(&DRIVER, anchor) {
        BOUND.store(true, Ordering::Release);
    }
}

/// NVML's `f` (`Sym::is_nvml`), null if no NVML is loaded. A `dlsym` door that already handed out our wrapper
/// filled its slot with what the caller's own handle answered; the rest come from the library holding it
/// (`bind_library`). Never loads NVML itself.
pub fn real_nvml(f: Sym) -> *mut c_void {
    debug_assert!(f.is_nvml());
    let p = REAL[f as usize].load(Ordering::Acquire);
    if !p.is_null() {
        return p;
    }
    bind_library(&NVML, null_mut());
    REAL[f as usize].load(Ordering::Acquire)
}

/// What `cuGetProcAddress` returned, swapped for our wrapper when it is one of the tracked functions, matched
/// by identity so that versions, `_ptsz` and flags stay the driver's own decision.
pub fn swap_proc(p: *mut c_void, wrapper: Wrapper) -> *mut c_void {
    if p.is_null() {
        return p;
    }
    for f in ALL[..WRAPPED].iter().filter(|f| !f.is_nvml()) {
        if REAL[*f as usize].load(Ordering::Acquire) == p {
            return wrapper(*f);
        }
    }
    p
}

/// Whether `symbol` is the base name of a tracked function ("cuMemAlloc" for "cuMemAlloc_v2"): used only to
/// say, in debug mode, that a lookup of a tracked function returned a pointer we did not recognise.
pub fn is_tracked_base(symbol: &CStr) -> bool {
    let s = symbol.to_bytes();
    ALL[..WRAPPED].iter().filter(|f| !f.is_nvml()).any(|f| {
        let n = f.name().to_bytes();
        n.starts_with(s) && matches!(&n[s.len()..], b"" | b"_v2" | b"_ptsz")
    })
}

/// The process sees this one device and no other (`devices` read it from the driver); `NO_DEVICE`: it does not.
pub(crate) fn set_only_device(dev: u32) {
    ONLY_DEVICE.store(dev, Ordering::Relaxed);
}

/// The device of the calling thread's current context, which the caller knows to exist (a call that needs one
/// just succeeded): where the process sees one device, that one without asking the driver; else
/// [`current_device`]. The driver's `cuCtxGetDevice` after a 1 MiB allocation cost about 0.1% of the pair
/// (docs/GPU-RESULTS.md, issue 27), most of it the trip to its code.
#[inline]
#[link_section = ".vramtrace.hot"]
pub fn context_device() -> u32 {
    let only = ONLY_DEVICE.load(Ordering::Relaxed);
    if only != vramtrace_format::NO_DEVICE {
        return only;
    }
    current_device()
}

/// The device of the calling thread's current context, or `NO_DEVICE`. Worker threads may have no context: the
/// result is checked, never assumed.
#[inline]
#[link_section = ".vramtrace.hot"]
pub fn current_device() -> u32 {
    let f = real(Sym::CtxGetDevice);
    if f.is_null() {
        return vramtrace_format::NO_DEVICE;
    }
    // SAFETY: `f` is non-null (checked above) and is the driver's `cuCtxGetDevice` (a `REAL` slot is filled only
    // by lookups of its exact name): `CUresult (CUdevice *device)`.
    let f: unsafe extern "C" fn(*mut c_int) -> u32 = unsafe { std::mem::transmute(f) };
    let mut dev: c_int = -1;
    // SAFETY: the driver's `cuCtxGetDevice` (above); `dev` is a local the call writes.
    if unsafe { f(&mut dev) } == 0 && dev >= 0 {
        dev as u32
    } else {
        vramtrace_format::NO_DEVICE
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sym_order_is_all_order_and_names_are_the_drivers() {
        for (i, f) in ALL.iter().enumerate() {
            assert_eq!(*f as usize, i);
            assert!(f
                .name()
                .to_bytes()
                .starts_with(if f.is_nvml() { b"nvml" } else { b"cu" }));
        }
        const { assert!(WRAPPED < COUNT) };
    }

    #[test]
    fn our_own_functions_are_never_taken_for_the_drivers() {
        assert!(in_this_library(current_device as *mut c_void));
        assert!(!in_this_library(libc::malloc as *mut c_void));
        assert!(!in_this_library(null_mut()));
    }
}
