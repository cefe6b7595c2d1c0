//! `NixlBackend`: the transfer seam over one NIXL agent.

use std::collections::HashMap;
use std::ffi::{c_void, CStr, CString};
use std::ptr;

use super::sys::{self, api, check, Api};
use crate::disagg::backend::{
    check_pairs, Desc, MemKind, Region, TransferBackend, XferId, XferOp, XferState,
};
use crate::disagg::regions::{decode_metadata, encode_metadata, RegionTable};
use crate::error::{KvError, KvResult};

const TAG: &str = "nixl";

/// How to create the agent.
#[derive(Clone, Debug)]
pub struct NixlConfig {
    /// This agent's name (unique among the agents that talk to each other).
    pub agent_name: String,
    /// NIXL backends (plugins) to create, each with its default parameters. "UCX" (the default
    /// and the one tested) moves DRAM and VRAM between agents; the seam has no file memory yet,
    /// so a file backend such as "POSIX" has nothing to move.
    pub backends: Vec<String>,
    /// NIXL's progress thread: transfers and notifications advance without polling.
    pub progress_thread: bool,
}

impl NixlConfig {
    /// UCX only, with the progress thread.
    pub fn new(agent_name: &str) -> Self {
        NixlConfig {
            agent_name: agent_name.to_string(),
            backends: vec!["UCX".into()],
            progress_thread: true,
        }
    }
}

struct Xfer {
    req: sys::XferReq,
    state: XferState,
    /// The registered local regions it touches (deregistration waits for its release).
    local: Vec<Desc>,
}

/// One NIXL agent. Dropping it releases its transfers (NIXL aborts those still running) and
/// destroys the agent.
pub struct NixlBackend {
    api: &'static Api,
    agent: sys::Agent,
    name: String,
    regions: RegionTable,
    /// Peers whose metadata NIXL holds, with the regions their blob announced.
    peers: HashMap<String, RegionTable>,
    xfers: HashMap<XferId, Xfer>,
    next_xfer: u64,
    notif_map: sys::NotifMap,
}

// SAFETY: the handles are owned by this value and used through `&mut self` only; NIXL agents
// may be called from any thread (one at a time with thread sync NONE).
unsafe impl Send for NixlBackend {}

fn cstring(what: &str, s: &str) -> KvResult<CString> {
    CString::new(s).map_err(|_| KvError::InvalidArgument(format!("{what} contains a NUL byte")))
}

fn mem_type(kind: MemKind) -> (i32, u64) {
    match kind {
        MemKind::Dram => (sys::MEM_DRAM, 0),
        MemKind::Vram { device } => (sys::MEM_VRAM, device as u64),
    }
}

impl NixlBackend {
    /// Loads the library (see `sys::api`), creates the agent and its backends.
    pub fn new(config: &NixlConfig) -> KvResult<Self> {
        if config.agent_name.is_empty() {
            return Err(KvError::InvalidArgument("empty agent name".into()));
        }
        if config.backends.is_empty() {
            return Err(KvError::InvalidArgument("no NIXL backend named".into()));
        }
        let name = cstring("agent name", &config.agent_name)?;
        let api = api()?;
        let cfg = sys::AgentConfig {
            enable_prog_thread: config.progress_thread,
            enable_listen_thread: false,
            listen_port: 0,
            thread_sync: sys::THREAD_SYNC_NONE,
            num_workers: 1,
            pthr_delay_us: 0,
            lthr_delay_us: 100_000,
            capture_telemetry: false,
        };
        let mut agent: sys::Agent = ptr::null_mut();
        // SAFETY: valid C string and config; `agent` receives the handle.
        check("nixl_capi_create_configured_agent", unsafe {
            (api.create_configured_agent)(name.as_ptr(), &cfg, &mut agent)
        })?;
        let mut this = NixlBackend {
            api,
            agent,
            name: config.agent_name.clone(),
            regions: RegionTable::default(),
            peers: HashMap::new(),
            xfers: HashMap::new(),
            next_xfer: 0,
            notif_map: ptr::null_mut(),
        };
        // From here on, Drop destroys the agent on every error path.
        // SAFETY: `notif_map` receives a new map.
        check("nixl_capi_create_notif_map", unsafe {
            (api.create_notif_map)(&mut this.notif_map)
        })?;
        for plugin in &config.backends {
            this.create_backend(plugin)?;
        }
        Ok(this)
    }

    fn create_backend(&mut self, plugin: &str) -> KvResult<()> {
        let api = self.api;
        let c_plugin = cstring("backend name", plugin)?;
        let mut mems: sys::MemList = ptr::null_mut();
        let mut params: sys::Params = ptr::null_mut();
        // SAFETY: live agent, valid C string; both outputs are freed below.
        let st = unsafe {
            (api.get_plugin_params)(self.agent, c_plugin.as_ptr(), &mut mems, &mut params)
        };
        if st != sys::SUCCESS {
            return Err(KvError::Transfer(format!(
                "NIXL has no usable {plugin:?} plugin (nixl_capi_get_plugin_params: {})",
                sys::describe(st)
            )));
        }
        let mut backend: sys::Backend = ptr::null_mut();
        // SAFETY: live agent, the plugin's default parameters.
        let st =
            unsafe { (api.create_backend)(self.agent, c_plugin.as_ptr(), params, &mut backend) };
        // SAFETY: created above, not used after this.
        unsafe {
            (api.destroy_mem_list)(mems);
            (api.destroy_params)(params);
        }
        if st != sys::SUCCESS {
            return Err(KvError::Transfer(format!(
                "creating NIXL backend {plugin:?} failed: {} (for UCX, see UCX_TLS / \
                 UCX_NET_DEVICES / UCX_MODULES)",
                sys::describe(st)
            )));
        }
        // The handle is only a wrapper around the agent's backend: the agent owns the backend.
        // SAFETY: created above.
        unsafe { (api.destroy_backend)(backend) };
        Ok(())
    }

    /// Registers or deregisters one region through a one-entry registration list.
    fn reg_call(&mut self, region: &Region, register: bool) -> KvResult<()> {
        let api = self.api;
        let (mem, dev) = mem_type(region.kind);
        let mut dlist: sys::RegDlist = ptr::null_mut();
        // SAFETY: `dlist` receives a new list, destroyed below.
        check("nixl_capi_create_reg_dlist", unsafe {
            (api.create_reg_dlist)(mem, &mut dlist)
        })?;
        // SAFETY: live list and agent; NIXL copies what it needs.
        let result = unsafe {
            check(
                "nixl_capi_reg_dlist_add_desc",
                (api.reg_dlist_add_desc)(
                    dlist,
                    region.addr as usize,
                    region.len as usize,
                    dev,
                    ptr::null(),
                    0,
                ),
            )
            .and_then(|()| {
                if register {
                    check(
                        "nixl_capi_register_mem",
                        (api.register_mem)(self.agent, dlist, ptr::null_mut()),
                    )
                } else {
                    check(
                        "nixl_capi_deregister_mem",
                        (api.deregister_mem)(self.agent, dlist, ptr::null_mut()),
                    )
                }
            })
        };
        // SAFETY: created above.
        unsafe { (api.destroy_reg_dlist)(dlist) };
        result
    }

    /// A transfer list of one memory kind.
    fn xfer_dlist(&self, kind: MemKind, descs: &[Desc]) -> KvResult<sys::XferDlist> {
        let api = self.api;
        let (mem, dev) = mem_type(kind);
        let mut dlist: sys::XferDlist = ptr::null_mut();
        // SAFETY: `dlist` receives a new list.
        check("nixl_capi_create_xfer_dlist", unsafe {
            (api.create_xfer_dlist)(mem, &mut dlist)
        })?;
        for d in descs {
            // SAFETY: live list.
            let st =
                unsafe { (api.xfer_dlist_add_desc)(dlist, d.addr as usize, d.len as usize, dev) };
            if let Err(e) = check("nixl_capi_xfer_dlist_add_desc", st) {
                // SAFETY: created above.
                unsafe { (api.destroy_xfer_dlist)(dlist) };
                return Err(e);
            }
        }
        Ok(dlist)
    }

    /// Releases and frees a request handle; Err (handle kept) if NIXL refuses.
    fn free_req(&mut self, req: sys::XferReq) -> KvResult<()> {
        // SAFETY: `req` came from create_xfer_req on this agent and was not freed.
        unsafe {
            check(
                "nixl_capi_release_xfer_req",
                (self.api.release_xfer_req)(self.agent, req),
            )?;
            (self.api.destroy_xfer_req)(req);
        }
        Ok(())
    }

    fn create_and_post(
        &mut self,
        op: XferOp,
        local_list: sys::XferDlist,
        remote_list: sys::XferDlist,
        peer: &CStr,
        notification: &[u8],
    ) -> KvResult<(sys::XferReq, XferState)> {
        let api = self.api;
        let mut opt: sys::OptArgs = ptr::null_mut();
        if !notification.is_empty() {
            // SAFETY: `opt` receives new arguments, destroyed below; NIXL copies the message.
            unsafe {
                check("nixl_capi_create_opt_args", (api.create_opt_args)(&mut opt))?;
                let st = (api.opt_args_set_notif_msg)(
                    opt,
                    notification.as_ptr() as *const c_void,
                    notification.len(),
                );
                let st = if st == sys::SUCCESS {
                    (api.opt_args_set_has_notif)(opt, true)
                } else {
                    st
                };
                if let Err(e) = check("setting the notification", st) {
                    (api.destroy_opt_args)(opt);
                    return Err(e);
                }
            }
        }
        let c_op = match op {
            XferOp::Write => sys::OP_WRITE,
            XferOp::Read => sys::OP_READ,
        };
        let mut req: sys::XferReq = ptr::null_mut();
        // SAFETY: live agent and lists; `opt` may be null.
        let st = unsafe {
            (api.create_xfer_req)(
                self.agent,
                c_op,
                local_list,
                remote_list,
                peer.as_ptr(),
                &mut req,
                opt,
            )
        };
        if !opt.is_null() {
            // SAFETY: created above; the request keeps its own copy.
            unsafe { (api.destroy_opt_args)(opt) };
        }
        check("nixl_capi_create_xfer_req", st)?;
        // SAFETY: the request was just created on this agent.
        let st = unsafe { (api.post_xfer_req)(self.agent, req, ptr::null_mut()) };
        let state = match st {
            sys::SUCCESS => XferState::Done,
            sys::IN_PROG => XferState::InProgress,
            _ => {
                let e = KvError::Transfer(format!(
                    "nixl_capi_post_xfer_req failed: {}",
                    sys::describe(st)
                ));
                if self.free_req(req).is_err() {
                    // NIXL would not release it: leak the handle rather than free it in use.
                }
                return Err(e);
            }
        };
        Ok((req, state))
    }

    fn known_peer(&self, peer: &str) -> KvResult<&RegionTable> {
        self.peers
            .get(peer)
            .ok_or_else(|| KvError::InvalidArgument(format!("unknown peer {peer:?}")))
    }
}

impl TransferBackend for NixlBackend {
    fn agent_name(&self) -> &str {
        &self.name
    }

    fn register(&mut self, region: &Region) -> KvResult<()> {
        let mut next = self.regions.clone();
        if !next.insert(region)? {
            return Ok(());
        }
        self.reg_call(region, true)?;
        self.regions = next;
        Ok(())
    }

    fn deregister(&mut self, region: &Region) -> KvResult<()> {
        let mut next = self.regions.clone();
        let registered = next.remove(region)?;
        if self.xfers.values().any(|x| {
            x.local
                .iter()
                .any(|d| RegionTable::overlaps(&registered, d))
        }) {
            return Err(KvError::InvalidArgument(format!(
                "region {:#x}+{} is used by a transfer not yet released",
                region.addr, region.len
            )));
        }
        self.reg_call(&registered, false)?;
        self.regions = next;
        Ok(())
    }

    fn local_metadata(&mut self) -> KvResult<Vec<u8>> {
        let mut data: *mut c_void = ptr::null_mut();
        let mut len = 0usize;
        // SAFETY: live agent; NIXL mallocs `data`, freed below.
        check("nixl_capi_get_local_md", unsafe {
            (self.api.get_local_md)(self.agent, &mut data, &mut len)
        })?;
        // SAFETY: NIXL returned `len` bytes at `data`.
        let md = unsafe { std::slice::from_raw_parts(data as *const u8, len) }.to_vec();
        // SAFETY: allocated with malloc by the library.
        unsafe { libc::free(data) };
        Ok(encode_metadata(TAG, &self.name, &self.regions, &md))
    }

    fn add_peer(&mut self, metadata: &[u8]) -> KvResult<String> {
        let info = decode_metadata(TAG, metadata)?;
        if info.payload.is_empty() {
            return Err(KvError::InvalidArgument(
                "peer metadata has no NIXL part".into(),
            ));
        }
        let mut name: *mut std::ffi::c_char = ptr::null_mut();
        // SAFETY: live agent; NIXL strdups the name, freed below.
        check("nixl_capi_load_remote_md", unsafe {
            (self.api.load_remote_md)(
                self.agent,
                info.payload.as_ptr() as *const c_void,
                info.payload.len(),
                &mut name,
            )
        })?;
        // SAFETY: a NUL-terminated string from strdup.
        let nixl_name = unsafe { CStr::from_ptr(name) }
            .to_string_lossy()
            .into_owned();
        // SAFETY: allocated by strdup in the library.
        unsafe { libc::free(name as *mut c_void) };
        if nixl_name != info.agent {
            return Err(KvError::InvalidArgument(format!(
                "peer metadata names agent {:?} but its NIXL part is agent {nixl_name:?}",
                info.agent
            )));
        }
        self.peers.insert(info.agent.clone(), info.regions);
        Ok(info.agent)
    }

    fn remove_peer(&mut self, peer: &str) -> KvResult<()> {
        self.known_peer(peer)?;
        let c_peer = cstring("peer name", peer)?;
        // SAFETY: live agent, valid C string.
        check("nixl_capi_invalidate_remote_md", unsafe {
            (self.api.invalidate_remote_md)(self.agent, c_peer.as_ptr())
        })?;
        self.peers.remove(peer);
        Ok(())
    }

    fn post(
        &mut self,
        op: XferOp,
        local: &[Desc],
        peer: &str,
        remote: &[Desc],
        notification: &[u8],
    ) -> KvResult<XferId> {
        check_pairs(local, remote)?;
        let local_kind = self.regions.kind_of("local", local)?;
        let remote_kind = self
            .known_peer(peer)?
            .kind_of(&format!("remote (agent {peer:?})"), remote)?;
        let c_peer = cstring("peer name", peer)?;
        let local_list = self.xfer_dlist(local_kind, local)?;
        let remote_list = match self.xfer_dlist(remote_kind, remote) {
            Ok(l) => l,
            Err(e) => {
                // SAFETY: created above.
                unsafe { (self.api.destroy_xfer_dlist)(local_list) };
                return Err(e);
            }
        };
        let posted = self.create_and_post(op, local_list, remote_list, &c_peer, notification);
        // SAFETY: created above; the request holds what it needs.
        unsafe {
            (self.api.destroy_xfer_dlist)(local_list);
            (self.api.destroy_xfer_dlist)(remote_list);
        }
        let (req, state) = posted?;
        let id = XferId(self.next_xfer);
        self.next_xfer += 1;
        self.xfers.insert(
            id,
            Xfer {
                req,
                state,
                local: local.to_vec(),
            },
        );
        Ok(id)
    }

    fn state(&mut self, xfer: XferId) -> XferState {
        let (api, agent) = (self.api, self.agent);
        let Some(x) = self.xfers.get_mut(&xfer) else {
            return XferState::Failed(format!("unknown transfer {xfer:?}"));
        };
        if x.state == XferState::InProgress {
            // SAFETY: live agent and request.
            let st = unsafe { (api.get_xfer_status)(agent, x.req) };
            x.state = match st {
                sys::SUCCESS => XferState::Done,
                sys::IN_PROG => XferState::InProgress,
                _ => XferState::Failed(format!("nixl_capi_get_xfer_status: {}", sys::describe(st))),
            };
        }
        x.state.clone()
    }

    fn release(&mut self, xfer: XferId) -> KvResult<()> {
        if !self.xfers.contains_key(&xfer) {
            return Err(KvError::InvalidArgument(format!(
                "unknown transfer {xfer:?}"
            )));
        }
        if self.state(xfer) == XferState::InProgress {
            return Err(KvError::InvalidArgument(format!(
                "transfer {xfer:?} is still in progress"
            )));
        }
        let req = self.xfers[&xfer].req;
        self.free_req(req)?;
        self.xfers.remove(&xfer);
        Ok(())
    }

    fn send_notification(&mut self, peer: &str, message: &[u8]) -> KvResult<()> {
        self.known_peer(peer)?;
        let c_peer = cstring("peer name", peer)?;
        // SAFETY: live agent; NIXL copies the message.
        check("nixl_capi_gen_notif", unsafe {
            (self.api.gen_notif)(
                self.agent,
                c_peer.as_ptr(),
                message.as_ptr() as *const c_void,
                message.len(),
                ptr::null_mut(),
            )
        })
    }

    fn take_notifications(&mut self) -> KvResult<Vec<(String, Vec<u8>)>> {
        let (api, map) = (self.api, self.notif_map);
        let read = self.read_notifications();
        // Cleared whatever happened: NIXL appends to the map, a failed read must not leave
        // entries to be returned twice.
        // SAFETY: live map.
        let cleared = check("nixl_capi_notif_map_clear", unsafe {
            (api.notif_map_clear)(map)
        });
        let out = read?;
        cleared?;
        Ok(out)
    }
}

impl NixlBackend {
    /// Fetches new notifications into the map and copies them out (the map is not cleared).
    fn read_notifications(&mut self) -> KvResult<Vec<(String, Vec<u8>)>> {
        let (api, map) = (self.api, self.notif_map);
        let mut out = Vec::new();
        // SAFETY: live agent and map; the strings and blobs read below belong to the map and
        // are copied before the map is cleared.
        unsafe {
            check(
                "nixl_capi_get_notifs",
                (api.get_notifs)(self.agent, map, ptr::null_mut()),
            )?;
            let mut agents = 0usize;
            check(
                "nixl_capi_notif_map_size",
                (api.notif_map_size)(map, &mut agents),
            )?;
            for i in 0..agents {
                let mut name: *const std::ffi::c_char = ptr::null();
                check(
                    "nixl_capi_notif_map_get_agent_at",
                    (api.notif_map_get_agent_at)(map, i, &mut name),
                )?;
                let peer = CStr::from_ptr(name).to_string_lossy().into_owned();
                let mut n = 0usize;
                check(
                    "nixl_capi_notif_map_get_notifs_size",
                    (api.notif_map_get_notifs_size)(map, name, &mut n),
                )?;
                for j in 0..n {
                    let mut data: *const c_void = ptr::null();
                    let mut len = 0usize;
                    check(
                        "nixl_capi_notif_map_get_notif",
                        (api.notif_map_get_notif)(map, name, j, &mut data, &mut len),
                    )?;
                    let msg = if len == 0 {
                        Vec::new()
                    } else {
                        std::slice::from_raw_parts(data as *const u8, len).to_vec()
                    };
                    out.push((peer.clone(), msg));
                }
            }
        }
        Ok(out)
    }
}

impl Drop for NixlBackend {
    fn drop(&mut self) {
        let reqs: Vec<sys::XferReq> = self.xfers.drain().map(|(_, x)| x.req).collect();
        for req in reqs {
            // A request NIXL will not release (still running) is left to the agent's teardown.
            let _ = self.free_req(req);
        }
        // SAFETY: handles created in `new`, not used after this.
        unsafe {
            if !self.notif_map.is_null() {
                (self.api.destroy_notif_map)(self.notif_map);
            }
            (self.api.destroy_agent)(self.agent);
        }
    }
}
