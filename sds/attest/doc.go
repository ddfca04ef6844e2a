// Package attest identifies the process at the other end of a unix socket,
// or one a broker names, for the node agent's servers (SDS, Workload API),
// one caller at a time, so that one agent can serve many workloads on a
// node (issue 34). It yields facts, never an identity: which identity
// facts grant, if any, is the server's decision.
//
// A gRPC server built with Attestor.Credentials reads each connection's
// caller from the kernel (SO_PEERCRED: pid, uid, gid) and pins that
// process (a pidfd, from SO_PEERPIDFD where the kernel has it, and its
// start time from /proc/<pid>/stat). Attest then reads its facts: unix
// facts (uid, gid, their names, and opt-in its binary's path and SHA-256)
// and, when /proc/<pid>/cgroup puts it in a pod (cgroup v1 or v2, systemd
// or cgroupfs driver, containerd, CRI-O or Docker), the pod UID and
// container ID, looked up by Pods among the pods the API server schedules
// to this node: namespace, service account, labels, container name and
// image. Last it checks that the pinned process is still alive with the
// same start time, so that facts read through a pid that meanwhile named
// another process are never used.
//
// Attestor.CredentialsWithTLS does the same on a socket that also serves
// mutual TLS (the SPIFFE Broker Endpoint's transport): a caller that opens
// with a TLS handshake is handshaken with the server's config, which must
// verify its X509-SVID, and Caller.SVID holds that SVID's SPIFFE ID;
// plaintext callers are served as before.
//
// A broker (the SPIFFE Broker API; ztunnel in Istio's ambient mode) names
// the workloads it serves instead of connecting as them, and the agent
// attests them itself. Attestor.PinPID pins a process named by pid as the
// handshake pins a socket's caller (pidfd_open, start time, effective
// uid and gid from /proc/<pid>/status), so Attest works on it unchanged;
// Caller.Exited is closed when it exits, so that a stream serving it ends
// with it (the wait parks on the runtime's poller: no thread per
// stream), and Caller.Close releases it. Pods.LookupPod gives the facts of
// a pod named by a PodRef (UID, or namespace and name), without a
// container, only for a pod on this node that is neither terminating nor
// finished; Pods.Changed is closed at the next change to the node's pods,
// when a stream on a pod reference looks it up again.
//
//	c, err := a.PinPID(pid) // from the broker's request
//	if err != nil {
//		return attest.Status(err)
//	}
//	defer c.Close()
//	facts, err := a.Attest(ctx, c)
//	...
//	select {
//	case <-c.Exited(): // the workload is gone: end the stream
//	case <-ctx.Done():
//	}
//
// A caller that cannot be attested is refused with the reason: Status
// gives PermissionDenied, InvalidArgument for a malformed pid or pod
// reference from a broker, or Unavailable while this node's pods cannot be
// read from the API server (retry; nothing is guessed). Never a default
// identity, never another workload's. Attest's refusals are counted by
// reason (trustbridge_agent_attestation_failures_total) and logged, rate
// limited; Reason labels PinPID's and LookupPod's alike.
//
//	pods, err := attest.NewPods(attest.PodsConfig{Client: client, NodeName: node, Logger: log})
//	a, err := attest.New(attest.Config{Pods: pods, Logger: log, Registerer: reg})
//	go pods.Run(ctx)
//	srv := grpc.NewServer(grpc.Creds(a.Credentials()))
//	...
//	// in a handler:
//	facts, err := a.AttestPeer(ctx)
//	if err != nil {
//		return attest.Status(err)
//	}
//
// The agent must run in the host's pid namespace, with the host's /proc
// (Config.ProcRoot where it is mounted elsewhere), and read pods with a
// client allowed to list and watch them. With Config.Binary the
// executable is pinned at the handshake too (device and inode of
// /proc/<pid>/exe): a caller that exec'ed another program since is
// refused, where SPIRE's unix attestor describes whatever runs at
// attestation. Known limit: on kernels
// without SO_PEERPIDFD (before 6.5) the process is pinned at the
// handshake, not at connect, so a caller that exits in between, its pid
// taken at once by another process, goes unnoticed (SPIRE has the same
// window): the kernel's pidfd closes it. An agent in its own
// cgroup namespace (a pod on cgroup v2) refuses callers in its own pod's
// other containers, and reads callers in its own container as outside
// any pod.
//
// A broker vouches for the pid it names: PinPID pins whatever process
// holds the pid at the call, so a pid reused between the broker reading it
// and the agent pinning it is the broker's window (Linux pids are reused
// only after the pid space wraps).
//
// References: the SPIFFE Workload Endpoint specification §5
// (Authentication: the caller is identified out of band, by attestation),
// https://github.com/spiffe/spiffe/blob/main/standards/SPIFFE_Workload_Endpoint.md,
// and the Workload API's §4.1 (Identifying the Caller);
// the SPIFFE Broker API (a draft: a broker names workloads by pid or by
// Kubernetes Pod);
// unix(7) SO_PEERCRED and SO_PEERPIDFD, pidfd_open(2) (a pidfd polls
// readable once its process exited), proc_pid_stat(5),
// proc_pid_status(5), cgroups(7); the kubelet's cgroup naming
// (pkg/kubelet/cm) for the path forms.
package attest
