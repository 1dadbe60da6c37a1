#!/bin/sh
# Runs inside the systemd guest of test_systemd.py (orion-selftest.service, once the guest has
# booted): installs Orion's packages the way a user does and checks each step against a real
# systemd. Each step prints "=== BEGIN <name>", its output and "=== END <name> rc=<n>" on the serial
# console (tests/integration/vm.py reads them); then the guest powers off.
exec > /dev/ttyS0 2>&1
log=/var/log/orion/server.log
begin() { echo "=== BEGIN $1"; }
end() { echo "=== END $1 rc=$2"; }
step() {  # step NAME COMMAND...
  name=$1; shift
  begin "$name"; "$@" 2>&1; end "$name" $?
}
wait_for() {  # wait_for SECONDS COMMAND...: until the command succeeds (its status)
  n=$(( $1 * 5 )); shift
  while [ $n -gt 0 ]; do "$@" >/dev/null 2>&1 && return 0; sleep 0.2; n=$((n-1)); done
  "$@"
}
listens() { [ "$(grep -c 'Orion Server listens' $log 2>/dev/null)" -ge "$1" ]; }
vm_xml() {  # a domain whose ivshmem-doorbell oriond serves (what orion-vm enable --doorbell on writes)
  cat <<XML
<domain type='qemu'><name>vm-sd</name>
  <metadata><orion:vgpu xmlns:orion="http://orion-vgpu.org/xmlns/libvirt/1.0" count="1" gmem="1000" processes="2" shm_mib="16"/></metadata>
  <devices><shmem name='orionsock-vm-sd'><model type='ivshmem-doorbell'/><server path='/dev/shm/orionsock-vm-sd.sock'/><msi vectors='2' ioeventfd='on'/></shmem></devices>
</domain>
XML
}
keeper() { pgrep -f -- '--doorbell-keeper' | tr '\n' ' ' | sed 's/ $//'; }

step systemd sh -c "cat /proc/1/comm; systemctl --version | head -1"
cd /root/debs

# The server package, then oriond enabled and started as the README says.
step install-server apt-get install -y -q -o Dpkg::Use-Pty=0 ./orion-server_*.deb
# No libvirt in this guest: its VM regions belong to root (an administrator's edit of server.conf).
sed -i 's/^\( *shm_\(user\|group\)_name = \).*/\1"root"/' /etc/orion/server.conf
begin enable-oriond
systemctl enable --now oriond.service; wait_for 60 listens 1; rc=$?
systemctl is-active oriond.service
end enable-oriond $rc

# A VM with a doorbell attached through the libvirt hook: oriond starts its doorbell keeper.
begin attach
vm_xml | /etc/libvirt/hooks/qemu.d/orion vm-sd prepare begin -; rc=$?
sleep 0.5
echo "keeper=$(keeper)"
end attach $rc
k1=$(keeper)

# systemctl restart: the unit stops only oriond (KillMode=process); the keeper stays, and the new
# oriond takes the VM's eventfds back.
begin restart
systemctl restart oriond.service; wait_for 60 listens 2; rc=$?
systemctl is-active oriond.service
echo "keeper=$(keeper) before=$k1"
grep 'VM vm-sd: restored' $log | tail -1
end restart $rc

# A crash: systemd restarts oriond (Restart=on-failure), and again nothing is lost.
begin crash
kill -9 "$(systemctl show -p MainPID --value oriond.service)"
wait_for 60 listens 3; rc=$?
systemctl is-active oriond.service
echo "keeper=$(keeper) before=$k1 restarts=$(systemctl show -p NRestarts --value oriond.service)"
grep 'VM vm-sd: restored' $log | tail -1
end crash $rc

begin controller
systemctl start orion-controller.service; sleep 2
systemctl is-active orion-controller.service; rc=$?
end controller $rc

# The VM stops: detached, then oriond stopped; the keeper, holding nothing, ends.
begin release
vm_xml | /etc/libvirt/hooks/qemu.d/orion vm-sd release end -; rc=$?
systemctl stop oriond.service
sleep 2
echo "keeper=[$(keeper)] oriond=$(systemctl is-active oriond.service)"
end release $rc

begin purge-server
apt-get purge -y -q -o Dpkg::Use-Pty=0 orion-server; rc=$?
echo "controller=$(systemctl is-active orion-controller.service) unit=$(ls /usr/lib/systemd/system/oriond.service 2>&1)"
end purge-server $rc

# The guest runtime: the client package in this VM, served by the host's oriond over ivshmem.
step install-client apt-get install -y -q -o Dpkg::Use-Pty=0 ./orion-client_*.deb
step orion-check orion-check runtime client
step device_props /opt/device_props
systemctl poweroff --no-block
