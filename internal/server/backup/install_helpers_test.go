package backup

import "time"

// Install moves staged to target in one call: OpenTarget, Target.Install,
// Release. staged must be on target's file system (beside it, or inside
// it when it exists).
func Install(staged, target string, force bool, now time.Time) (replaced string, err error) {
	t, err := OpenTarget(target, TargetOptions{Force: force, Command: "trustbridge restore"})
	if err != nil {
		return "", err
	}
	defer t.Release()
	return t.Install(staged, now)
}
