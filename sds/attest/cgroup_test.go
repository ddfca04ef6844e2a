package attest

import (
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

const (
	testUID  = "3f2a8c1e-5b7d-4e9a-a0c4-1d2e3f4a5b6c"
	testUID_ = "3f2a8c1e_5b7d_4e9a_a0c4_1d2e3f4a5b6c"
	testCID  = "8d7e6f5a4b3c2d1e0f9a8b7c6d5e4f3a2b1c0d9e8f7a6b5c4d3e2f1a0b9c8d7e"
	otherCID = "0000000000000000000000000000000000000000000000000000000000000001"
	otherUID = "aaaaaaaa-bbbb-cccc-dddd-eeeeeeeeeeee"
)

func TestParseCgroup(t *testing.T) {
	inPod := cgroupPlace{podUID: testUID, containerID: testCID}
	tests := []struct {
		name    string
		in      string
		want    cgroupPlace
		wantErr string
	}{
		{"v2 systemd containerd burstable", "0::/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod" + testUID_ + ".slice/cri-containerd-" + testCID + ".scope\n", inPod, ""},
		{"v2 systemd besteffort", "0::/kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod" + testUID_ + ".slice/cri-containerd-" + testCID + ".scope\n", inPod, ""},
		{"v2 systemd guaranteed", "0::/kubepods.slice/kubepods-pod" + testUID_ + ".slice/cri-containerd-" + testCID + ".scope\n", inPod, ""},
		{"cgroupfs burstable", "0::/kubepods/burstable/pod" + testUID + "/" + testCID + "\n", inPod, ""},
		{"cgroupfs besteffort", "0::/kubepods/besteffort/pod" + testUID + "/" + testCID, inPod, ""},
		{"cgroupfs guaranteed docker", "0::/kubepods/pod" + testUID + "/" + testCID, inPod, ""},
		{"crio", "0::/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod" + testUID_ + ".slice/crio-" + testCID + ".scope", inPod, ""},
		{"docker systemd", "0::/kubepods.slice/kubepods-pod" + testUID_ + ".slice/docker-" + testCID + ".scope", inPod, ""},
		{"kind prefix", "0::/kubelet.slice/kubelet-kubepods.slice/kubelet-kubepods-besteffort.slice/kubelet-kubepods-besteffort-pod" + testUID_ + ".slice/cri-containerd-" + testCID + ".scope", inPod, ""},
		{"cgroup namespace", "0::/../../kubepods-besteffort-pod" + testUID_ + ".slice/cri-containerd-" + testCID + ".scope", inPod, ""},
		{"cgroup namespace cgroupfs guaranteed", "0::/../../pod" + testUID + "/" + testCID, inPod, ""},
		{"sub-cgroup of the container", "0::/kubepods/pod" + testUID + "/" + testCID + "/init", inPod, ""},
		{"v1 controllers agree", "12:pids:/kubepods/burstable/pod" + testUID + "/" + testCID + "\n" +
			"3:cpu,cpuacct:/kubepods/burstable/pod" + testUID + "/" + testCID + "\n" +
			"1:name=systemd:/kubepods/burstable/pod" + testUID + "/" + testCID + "\n0::/\n", inPod, ""},
		{"hybrid: v2 line at the root", "12:pids:/kubepods.slice/kubepods-pod" + testUID_ + ".slice/cri-containerd-" + testCID + ".scope\n0::/\n", inPod, ""},
		{"not in a pod: user slice", "0::/user.slice/user-1000.slice/session-2.scope\n", cgroupPlace{}, ""},
		{"not in a pod: root", "0::/\n", cgroupPlace{}, ""},
		{"not in a pod: v1", "9:name=systemd:/\n8:pids:/\n4:memory:/process_api/2ae4676ea273c8700109e2ffbb4c334b\n0::/\n", cgroupPlace{}, ""},
		{"pod segment name outside kubepods", "0::/system.slice/pod" + testUID + "/" + testCID, cgroupPlace{}, ""},

		{"v1 controllers disagree on container", "12:pids:/kubepods/pod" + testUID + "/" + testCID + "\n1:name=systemd:/kubepods/pod" + testUID + "/" + otherCID + "\n", cgroupPlace{}, "disagrees"},
		{"v1 controllers disagree on pod", "12:pids:/kubepods/pod" + testUID + "/" + testCID + "\n1:name=systemd:/kubepods/pod" + otherUID + "/" + testCID + "\n", cgroupPlace{}, "disagrees"},
		{"pod's own cgroup", "0::/kubepods.slice/kubepods-pod" + testUID_ + ".slice\n", cgroupPlace{}, "not in a container"},
		{"pod's own cgroup, trailing slash", "0::/kubepods/pod" + testUID + "/", cgroupPlace{}, "not in a container"},
		{"crio conmon", "0::/kubepods.slice/kubepods-pod" + testUID_ + ".slice/crio-conmon-" + testCID + ".scope", cgroupPlace{}, "conmon"},
		{"under kubepods but no pod", "0::/kubepods.slice/kubepods-burstable.slice\n", cgroupPlace{}, "not in a pod"},
		{"malformed UID systemd", "0::/kubepods.slice/kubepods-pod3f2a8c1e_5b7d.slice/cri-containerd-" + testCID + ".scope", cgroupPlace{}, "UUID"},
		{"UID with dashes in systemd form", "0::/kubepods.slice/kubepods-pod" + testUID + ".slice/cri-containerd-" + testCID + ".scope", cgroupPlace{}, "UUID"},
		{"uppercase UID", "0::/kubepods/pod" + strings.ToUpper(testUID) + "/" + testCID, cgroupPlace{}, "UUID"},
		{"malformed UID cgroupfs", "0::/kubepods/burstable/podnot-a-uid/" + testCID, cgroupPlace{}, "UUID"},
		{"short container ID", "0::/kubepods/pod" + testUID + "/" + testCID[:63], cgroupPlace{}, "64 hex"},
		{"non-hex container ID", "0::/kubepods/pod" + testUID + "/" + strings.Repeat("g", 64), cgroupPlace{}, "64 hex"},
		{"unknown runtime prefix", "0::/kubepods.slice/kubepods-pod" + testUID_ + ".slice/rkt-" + testCID + ".scope", cgroupPlace{}, "64 hex"},
		{"two pods", "0::/kubepods/pod" + testUID + "/" + testCID + "/kubepods/pod" + otherUID + "/" + testCID, cgroupPlace{}, "two pods"},
		{"cgroup namespace, own pod's sibling", "0::/../cri-containerd-" + testCID + ".scope", cgroupPlace{}, "cgroup namespace"},
		{"cgroup namespace, host process", "0::/../../../system.slice/sshd.service", cgroupPlace{}, "cgroup namespace"},
		{"empty", "", cgroupPlace{}, "empty"},
		{"no path", "0:\n", cgroupPlace{}, "hierarchy-ID"},
		{"relative path", "0::kubepods\n", cgroupPlace{}, "absolute"},
		{"bad hierarchy", "x::/\n", cgroupPlace{}, "number"},
		{"blank line inside", "0::/\n\n1:pids:/\n", cgroupPlace{}, "hierarchy-ID"},
		{"too large", strings.Repeat("0::/\n", maxCgroupSize/5+1), cgroupPlace{}, "over"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := parseCgroup([]byte(tt.in))
			if tt.wantErr != "" {
				require.Error(t, err)
				assert.Contains(t, err.Error(), tt.wantErr)
				assert.Zero(t, got)
				return
			}
			require.NoError(t, err)
			assert.Equal(t, tt.want, got)
		})
	}
}

func FuzzParseCgroup(f *testing.F) {
	for _, s := range []string{
		"0::/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod" + testUID_ + ".slice/cri-containerd-" + testCID + ".scope\n",
		"12:pids:/kubepods/burstable/pod" + testUID + "/" + testCID + "\n1:name=systemd:/kubepods/burstable/pod" + testUID + "/" + testCID + "\n0::/\n",
		"0::/../../pod" + testUID + "/" + testCID,
		"0::/user.slice/user-1000.slice/session-2.scope\n",
		"0::/\n",
		"",
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		p, err := parseCgroup(b)
		if err != nil {
			if p != (cgroupPlace{}) {
				t.Fatalf("error %v with a place %+v", err, p)
			}
			return
		}
		if p.inPod() {
			if !isUUID(p.podUID) || !isContainerID(p.containerID) {
				t.Fatalf("accepted malformed place %+v", p)
			}
			if !strings.Contains(string(b), p.containerID) {
				t.Fatalf("container %s is not in the input", p.containerID)
			}
		} else if p.containerID != "" {
			t.Fatalf("container without a pod: %+v", p)
		}
	})
}
