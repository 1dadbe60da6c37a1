-- job_submit.lua for Orion (Slurm's job_submit/lua plugin: JobSubmitPlugins=lua in slurm.conf,
-- this file beside slurm.conf).
--
-- A job that asks for vGPUs (--orion-vgpus=N [--orion-gmem=MIB], options of orion_spank.so, which
-- puts ORION_VGPUS and ORION_GMEM into the job's spank_job_env) is given N of the cluster's
-- "orion_vgpu" licenses (slurm.conf: Licenses=orion_vgpu:<the pool's vGPU count>). Slurm then
-- keeps it in the queue (squeue reason "Licenses") until that many vGPUs are not held by other
-- jobs, instead of starting it on a full pool. Its Comment says what it asked for, so squeue -o %k
-- and scontrol show job show the request.
local function orion_request(job_desc)
  local env = job_desc.spank_job_env
  if env == nil then return nil end
  local vgpus, gmem
  for _, kv in pairs(env) do
    local k, v = string.match(kv, "^([^=]+)=(.*)$")
    if k == "ORION_VGPUS" then vgpus = v elseif k == "ORION_GMEM" then gmem = v end
  end
  return vgpus, gmem
end

function slurm_job_submit(job_desc, part_list, submit_uid)
  local vgpus, gmem = orion_request(job_desc)
  if vgpus == nil then return slurm.SUCCESS end
  local n = tonumber(vgpus)
  if n == nil or n < 1 or n > 16 or n ~= math.floor(n) then
    slurm.log_user("orion: --orion-vgpus must be 1..16, not %s", vgpus)
    return slurm.ERROR
  end
  local lic = "orion_vgpu:" .. string.format("%d", n)
  if job_desc.licenses == nil or job_desc.licenses == "" then
    job_desc.licenses = lic
  elseif not string.find(job_desc.licenses, "orion_vgpu", 1, true) then
    job_desc.licenses = job_desc.licenses .. "," .. lic
  end
  local mib = tonumber(gmem or "0") or 0
  local what = string.format("orion: %d vGPU(s) of %s", n, mib > 0 and string.format("%d MiB", mib) or "the default size")
  if job_desc.comment == nil or job_desc.comment == "" then
    job_desc.comment = what
  end
  slurm.log_info("%s for the job of uid %d (licenses %s)", what, submit_uid, job_desc.licenses)
  return slurm.SUCCESS
end

function slurm_job_modify(job_desc, job_rec, part_list, modify_uid)
  return slurm.SUCCESS
end

return slurm.SUCCESS
