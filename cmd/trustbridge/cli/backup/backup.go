package backup

import (
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"

	"github.com/spf13/cobra"

	"github.com/trustbridge/trustbridge/ca"
	"github.com/trustbridge/trustbridge/cmd/trustbridge/cli"
	"github.com/trustbridge/trustbridge/federation"
	"github.com/trustbridge/trustbridge/internal/authn"
	"github.com/trustbridge/trustbridge/internal/fileutil"
	"github.com/trustbridge/trustbridge/internal/server"
	"github.com/trustbridge/trustbridge/internal/server/backup"
)

// NewCmd is trustbridge backup; version, the build's (trustbridge
// version), goes in the archive's manifest.
func NewCmd(e cli.Env, version string) *cobra.Command {
	var dataDir, out string
	cmd := &cobra.Command{
		Use:   "backup --data-dir DIR --out FILE",
		Short: "Archive a data directory (CA state, federated bundles, audit log) while the server runs",
		Long: `Write a tar.gz archive of --data-dir: a manifest (format, trust domain, time,
spiffe_sequence), every file, and their SHA-256 checksums. It is safe while
the server runs: the CA state is read under its lock (shared, which needs
no write access: a read-only data dir, a snapshot, backs up too) and checked
as a start would check it, other files are replaced whole by the server and are read
as they were when opened, and the audit log is copied up to its last
complete line. Lock files are left out.

The archive holds the CA's private keys: it is written mode 0600, and an
existing FILE is never overwritten. Keep it as you keep the keys.
--out - writes it to standard output (to encrypt it on the way).

A server started on a restored archive publishes a spiffe_sequence above
any it published before, so federated peers accept it (docs/operations.md,
"Backup and restore").`,
		Example: `  trustbridge backup --data-dir /var/lib/trustbridge --out trustbridge-$(date +%F).tar.gz
  trustbridge backup --data-dir ./data --out - | age -r "$RECIPIENT" > backup.tar.gz.age`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			return runBackup(e, dataDir, out, version)
		},
	}
	cmd.Flags().StringVar(&dataDir, "data-dir", "./data", "the server's --data-dir to archive (file storage; with --storage kube back up the CA Secret)")
	cmd.Flags().StringVar(&out, "out", "", `archive to write, mode 0600; refused if it exists or lies inside --data-dir; "-" for standard output`)
	_ = cmd.MarkFlagRequired("out")
	return cmd
}

func runBackup(e cli.Env, dataDir, out, version string) error {
	if err := checkBackupOut(dataDir, out); err != nil {
		return err
	}
	j, state, err := ca.Snapshot(dataDir)
	if errors.Is(err, fs.ErrPermission) {
		return fmt.Errorf("backup: %w: the CA state is readable by the server's user alone; run backup as that user", err)
	}
	if err != nil {
		return fmt.Errorf("backup: %w (is --data-dir the server's?)", err)
	}
	// The admin token is a credential of the running server, new at each
	// start: an archive has no use for it and should not carry it.
	others, err := backup.Collect(dataDir, ca.StateDir, server.AdminTokenName)
	if err != nil {
		return err
	}
	files := make([]backup.File, 0, len(state)+len(others))
	for _, f := range state {
		files = append(files, backup.File{Path: f.Name, Mode: f.Mode, Data: f.Data})
	}
	files = append(files, others...)
	m := backup.Manifest{TrustDomain: j.TrustDomain, Created: e.Now().UTC(), Sequence: j.Sequence, Version: version}
	report := e.Out
	if out == "-" {
		report = e.Err
		if err := backup.Write(e.Out, m, files); err != nil {
			return fmt.Errorf("backup: %w", err)
		}
	} else if err := writeNewFile(out, func(w io.Writer) error { return backup.Write(w, m, files) }); err != nil {
		return fmt.Errorf("backup: %w", err)
	}
	fmt.Fprintf(report, "backed up trust domain %s (sequence %d, %d files) from %s to %s\n", m.TrustDomain, m.Sequence, len(files), dataDir, out)
	return nil
}

// checkBackupOut refuses an archive inside the directory it archives (a
// later backup would hold this one) and one that already exists.
func checkBackupOut(dataDir, out string) error {
	if out == "" {
		return errors.New("backup: --out is required")
	}
	if out == "-" {
		return nil
	}
	absDir, err := filepath.Abs(dataDir)
	if err != nil {
		return err
	}
	absOut, err := filepath.Abs(out)
	if err != nil {
		return err
	}
	if _, in := backup.Inside(absDir, absOut); in || absOut == absDir {
		return fmt.Errorf("backup: --out %s is inside --data-dir %s; write the archive elsewhere", out, dataDir)
	}
	if _, err := os.Lstat(out); err == nil {
		return fmt.Errorf("backup: %s exists; backup never overwrites an archive, pick a new name", out)
	}
	return nil
}

// writeNewFile writes path (mode 0600) with atomicfile.WriteNew: path
// never holds half an archive, and one created meanwhile is not
// overwritten.
func writeNewFile(path string, write func(io.Writer) error) error {
	err := fileutil.WriteNew(path, 0o600, write)
	if errors.Is(err, fs.ErrExist) {
		return fmt.Errorf("%s exists; backup never overwrites an archive, pick a new name", path)
	}
	return err
}

func NewRestoreCmd(e cli.Env) *cobra.Command {
	var (
		dataDir, from string
		force         bool
		sequenceAbove uint64
	)
	cmd := &cobra.Command{
		Use:   "restore --data-dir DIR --from FILE",
		Short: "Restore a data directory from a trustbridge backup archive",
		Long: `Restore --data-dir from an archive written by trustbridge backup. The archive is
checked before anything is put in place: every file against its checksum,
names and file types, and the CA state as a server start would check it.
Files are written without group or other write, private keys 0600.

A missing or empty --data-dir is filled (lost+found does not count). A
non-empty one is refused unless --force, which first moves it aside to
DIR.replaced-<time>; a mount point (a volume), which cannot be moved, keeps
its place and its old entries move into DIR/replaced-<time> instead, with
lost+found left where it is. Nothing is deleted. --data-dir stays locked
from the first check until the restored state is in place: a restore is
refused while a server or a ca command uses it, and a server starting
during the restore is refused. Stop the server first.

The restored state holds the sequence it had at the backup, lower than what
peers may hold now. The server's first start on it publishes a sequence
above both (the start time in Unix seconds), so peers accept it. If peers
hold a sequence from a clock that ran ahead, --sequence-above moves the
restored state past it (docs/operations.md, "Disaster cases").`,
		Example: `  systemctl stop trustbridge
  trustbridge restore --data-dir /var/lib/trustbridge --from trustbridge-2026-05-01.tar.gz --force
  systemctl start trustbridge`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			return runRestore(e, restoreOptions{dataDir: dataDir, from: from, force: force, sequenceAbove: sequenceAbove})
		},
	}
	f := cmd.Flags()
	f.StringVar(&dataDir, "data-dir", "./data", "directory to restore into: missing or empty, or moved aside with --force")
	f.StringVar(&from, "from", "", `archive written by trustbridge backup; "-" for standard input`)
	f.BoolVar(&force, "force", false, "restore over a non-empty --data-dir, after moving it aside to DIR.replaced-<time> (on a mount point its entries to DIR/replaced-<time>)")
	f.Uint64Var(&sequenceAbove, "sequence-above", 0, "move the restored spiffe_sequence past this one (the highest a peer holds, from its status), for peers that hold one from a clock that ran ahead; peers refuse that same sequence with other keys, so the state goes to one more, and the server's start publishes one more again")
	_ = cmd.MarkFlagRequired("from")
	return cmd
}

type restoreOptions struct {
	dataDir, from string
	force         bool
	sequenceAbove uint64
}

// restoreLockCommand is what the lock record of a restore's target names.
const restoreLockCommand = "trustbridge restore"

func runRestore(e cli.Env, o restoreOptions) error {
	target, err := filepath.Abs(o.dataDir)
	if err != nil {
		return err
	}
	// The target stays locked from this check until the restored state is
	// in place: a server starting meanwhile is refused, naming the restore.
	t, err := backup.OpenTarget(target, backup.TargetOptions{Force: o.force, Commit: ca.StateDir, Command: restoreLockCommand})
	if err != nil {
		return err
	}
	defer t.Release()
	in := e.In
	if o.from != "-" {
		f, err := os.Open(o.from)
		if err != nil {
			return fmt.Errorf("restore: %w", err)
		}
		defer f.Close()
		in = f
	}
	staged, err := t.StageDir()
	if err != nil {
		return err
	}
	keep := false
	defer func() {
		if !keep {
			_ = os.RemoveAll(staged)
		}
	}()
	m, seq, err := stageRestore(in, staged, o)
	if err != nil {
		return fmt.Errorf("restore: %s: %w", o.from, err)
	}
	replaced, err := t.Install(staged, e.Now())
	if err != nil {
		// Half way, the staging directory holds restored state the error
		// names: keep it.
		keep = errors.Is(err, backup.ErrHalfway)
		return err
	}
	keep = true
	fmt.Fprintf(e.Out, "restored trust domain %s into %s from %s (backed up %s, sequence %d)\n",
		m.TrustDomain, o.dataDir, o.from, m.Created.UTC().Format("2006-01-02T15:04:05Z"), seq)
	if replaced != "" {
		fmt.Fprintf(e.Out, "the previous contents of %s are in %s\n", o.dataDir, replaced)
	}
	fmt.Fprintf(e.Out, "start the server on %s: it publishes the restored roots with a sequence above %d and above its start time, which peers accept\n", o.dataDir, seq)
	return nil
}

// stageRestore extracts the archive into staged and checks the state in it
// as a start would: the CA state loads, belongs to the manifest's trust
// domain and holds the manifest's sequence; the consumed-token ledger (if
// any) loads, since a server refuses to start without it and dropping it
// would make every single-use token it records usable again; every
// last-known-good bundle loads. It returns the sequence the state holds
// after --sequence-above.
func stageRestore(in io.Reader, staged string, o restoreOptions) (*backup.Manifest, uint64, error) {
	m, err := backup.Extract(in, staged, backup.DefaultLimits)
	if err != nil {
		return nil, 0, err
	}
	j, _, err := ca.NewStore(staged).Load(m.TrustDomain)
	if err != nil {
		return nil, 0, fmt.Errorf("the archived CA state does not load: %w", err)
	}
	if j == nil {
		return nil, 0, errors.New("the archive holds no CA state")
	}
	if j.Sequence != m.Sequence {
		return nil, 0, fmt.Errorf("the manifest says sequence %d, the archived CA state holds %d", m.Sequence, j.Sequence)
	}
	if _, err := authn.OpenFileLedger(filepath.Join(staged, authn.LedgerFileName)); err != nil {
		return nil, 0, fmt.Errorf("the archived consumed-token ledger does not load: %w", err)
	}
	if _, errs := federation.NewLKGStore(staged).LoadAll(); len(errs) > 0 {
		return nil, 0, fmt.Errorf("an archived last-known-good bundle does not load: %w", errors.Join(errs...))
	}
	seq := j.Sequence
	if o.sequenceAbove > 0 {
		if seq, err = ca.RaiseSequence(staged, o.sequenceAbove); err != nil {
			return nil, 0, err
		}
	}
	return m, seq, nil
}
