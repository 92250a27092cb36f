# Sourced by the scripts that run a node agent (node-agent or the upstream kubelet) on a private containerd
# beside a testenv control plane (hack/conformance.sh, hack/traffic.sh): the pieces of a node they share.

# free_port: a TCP port on 127.0.0.1 nobody listens on now
free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }

# agent_cgroup_root NAME: the agent's cgroup root in every v1 hierarchy, cpusets copied from the root (a new
# cpuset cgroup starts empty and takes no task)
agent_cgroup_root() {
  local h f
  for h in /sys/fs/cgroup/*/; do
    [ -L "${h%/}" ] && continue
    mkdir -p "$h$1"
    for f in cpuset.cpus cpuset.mems; do [ -f "$h$f" ] && cat "$h$f" > "$h$1/$f"; done
  done
  return 0
}

# agent_config DIR NODE NODE_IP CP_DIR CRI_DIR CGROUP_ROOT: a serving certificate for NODE signed by the control
# plane's CA (DIR/serving.{crt,key}) and the KubeletConfiguration both agents run with (DIR/kubelet-config.yaml):
# the kubelet API on NODE_IP at a free port, healthz on 127.0.0.1, x509 client authentication, the given runtime
# and cgroup root, pod logs in DIR/pod-logs. Image GC is off: the tests' images are imported, not pulled (there
# is no registry), and GC would remove them on a machine whose disk is fuller than the default 85 %.
agent_config() {
  local dir=$1 node=$2 node_ip=$3 cp_dir=$4 cri_dir=$5 cgroup_root=$6 port healthz
  port=$(free_port); healthz=$(free_port)
  openssl req -new -newkey rsa:2048 -nodes -keyout "$dir/serving.key" -subj "/CN=$node@serving" \
    -out "$dir/serving.csr" 2>/dev/null
  printf 'subjectAltName=IP:%s,IP:127.0.0.1,DNS:%s\nextendedKeyUsage=serverAuth\n' "$node_ip" "$node" \
    > "$dir/serving.ext"
  openssl x509 -req -in "$dir/serving.csr" -CA "$cp_dir/pki/ca.crt" -CAkey "$cp_dir/pki/ca.key" -CAcreateserial \
    -days 2 -extfile "$dir/serving.ext" -out "$dir/serving.crt" 2>/dev/null
  cat > "$dir/kubelet-config.yaml" <<CONF
apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
address: $node_ip
port: $port
healthzBindAddress: 127.0.0.1
healthzPort: $healthz
readOnlyPort: 0
tlsCertFile: $dir/serving.crt
tlsPrivateKeyFile: $dir/serving.key
authentication:
  x509:
    clientCAFile: $cp_dir/pki/ca.crt
containerRuntimeEndpoint: unix://$cri_dir/containerd.sock
cgroupDriver: cgroupfs
cgroupRoot: /$cgroup_root
failCgroupV1: false
podLogsDir: $dir/pod-logs
clusterDNS: [10.96.0.10]
clusterDomain: cluster.local
evictionHard: {memory.available: 100Mi, nodefs.available: 2%, imagefs.available: 2%}
imageGCHighThresholdPercent: 100
CONF
}
