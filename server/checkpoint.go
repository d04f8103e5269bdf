package server

import (
	"cmp"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/fptps/fpt/classic"
	"github.com/fptps/fpt/kvstore"
	"github.com/fptps/fpt/node"
)

// Checkpoint files. A server writes its store only while it holds exactly
// its keys of a classic layout (classic.Ranges.Stable), to a file named by
// the job's stamp (cluster.Member.JobStamp), the layout's version and its
// id, rewritten in place while that layout lasts:
//
//	job-<stamp, 16 hex digits>-layout-<version>-server-<id>.ckpt
//
// The files of one stamp and version are a set, complete once every
// server of that layout wrote its file: then every key of the job is in
// exactly one of them. A key handed over in a later layout stays in the
// older set until the newer one is complete, so a restart never misses
// it. A job's server loads the newest complete set (the greatest stamp,
// then version), keeping the keys it owns in its own first layout,
// whatever the number of servers was then; files older than the newest
// complete set are removed once it is complete.

// ckptLabel is what a checkpoint file is of: a layout of a job's run.
type ckptLabel struct {
	stamp   uint64
	version uint32
}

func (l ckptLabel) compare(o ckptLabel) int {
	return cmp.Or(cmp.Compare(l.stamp, o.stamp), cmp.Compare(l.version, o.version))
}

func (l ckptLabel) String() string { return fmt.Sprintf("job %016x layout v%d", l.stamp, l.version) }

// ckptFile is a checkpoint file's name, parsed.
type ckptFile struct {
	ckptLabel
	server node.ID
	name   string
}

func ckptName(l ckptLabel, server node.ID) string {
	return fmt.Sprintf("job-%016x-layout-%d-server-%d.ckpt", l.stamp, l.version, server)
}

// parseCkptName parses ckptName's names; ok is false for any other.
func parseCkptName(name string) (f ckptFile, ok bool) {
	var id uint32
	if _, err := fmt.Sscanf(name, "job-%x-layout-%d-server-%d.ckpt", &f.stamp, &f.version, &id); err != nil {
		return ckptFile{}, false
	}
	f.server, f.name = node.ID(id), name
	return f, ckptName(f.ckptLabel, f.server) == name // the one spelling
}

// legacyCkpt matches the files of fpt before sets: server-<rank>.ckpt.
func legacyCkpt(name string) bool {
	rank, ok := strings.CutPrefix(name, "server-")
	rank, ok2 := strings.CutSuffix(rank, ".ckpt")
	_, err := strconv.Atoi(rank)
	return ok && ok2 && err == nil
}

// ckptSets groups files by label, the newest set first.
func ckptSets(files []ckptFile) [][]ckptFile {
	files = slices.Clone(files)
	slices.SortFunc(files, func(a, b ckptFile) int {
		return cmp.Or(b.compare(a.ckptLabel), cmp.Compare(a.server, b.server))
	})
	var sets [][]ckptFile
	for i := 0; i < len(files); {
		j := i + 1
		for j < len(files) && files[j].ckptLabel == files[i].ckptLabel {
			j++
		}
		sets = append(sets, files[i:j])
		i = j
	}
	return sets
}

// missing is the first server of l without a file in set; 0: none, the
// set is complete.
func missing(set []ckptFile, l classic.Layout) node.ID {
	for _, id := range l.Servers {
		if !slices.ContainsFunc(set, func(f ckptFile) bool { return f.server == id }) {
			return id
		}
	}
	return 0
}

// ckptMeta is a checkpoint's label, writer and layout, in the snapshot's
// meta: stamp uint64, writer uint32, then the layout (classic's
// encoding), little-endian.
func ckptMeta(l ckptLabel, writer node.ID, layout classic.Layout) []byte {
	b := binary.LittleEndian.AppendUint64(nil, l.stamp)
	b = binary.LittleEndian.AppendUint32(b, uint32(writer))
	return layout.AppendBinary(b)
}

// checkMeta checks that a file's meta says what its name does, and
// returns its layout.
func checkMeta(f ckptFile, meta []byte) (classic.Layout, error) {
	if len(meta) < 12 {
		return classic.Layout{}, fmt.Errorf("%d bytes of meta, not a label", len(meta))
	}
	l, err := classic.ParseLayout(meta[12:])
	switch stamp, writer := binary.LittleEndian.Uint64(meta), node.ID(binary.LittleEndian.Uint32(meta[8:])); {
	case err != nil:
		return l, err
	case stamp != f.stamp || writer != f.server || l.Version != f.version:
		return l, fmt.Errorf("holds the checkpoint of %s by %s, not what its name says", ckptLabel{stamp, l.Version}, writer)
	case l.Index(writer) < 0:
		return l, fmt.Errorf("written by %s, which is not in its layout %s", writer, l)
	}
	return l, nil
}

// checkpointSet is a directory's newest complete set: its files and
// layout. It is empty (no files) if the directory has none.
type checkpointSet struct {
	ckptLabel
	files  []ckptFile
	layout classic.Layout
	passed []string // the newer sets passed over, and what they lack
	later  ckptFile // the newest file of a run not below newestSet's before; name "" if none
}

// newestSet finds dir's newest complete set of checkpoints of a run with a
// stamp below before, reading the meta of one file of each set newer than
// it. A file of fpt's former naming, or a set whose file is unreadable, is
// an error naming the file.
func newestSet(dir string, before uint64) (checkpointSet, error) {
	entries, err := os.ReadDir(dir)
	if err != nil {
		return checkpointSet{}, fmt.Errorf("server: checkpoints: %w", err)
	}
	var c checkpointSet
	var files []ckptFile
	for _, e := range entries {
		f, ok := parseCkptName(e.Name())
		switch {
		case !e.Type().IsRegular():
			// Not one of ours (writeAtomic makes regular files).
		case ok && f.stamp < before:
			files = append(files, f)
		case ok:
			if c.later.name == "" || f.stamp > c.later.stamp {
				c.later = f
			}
		case legacyCkpt(e.Name()):
			return checkpointSet{}, fmt.Errorf("server: checkpoint %s is of an earlier fpt (one file per rank), which this one does not read: move it away to start empty", filepath.Join(dir, e.Name()))
		}
	}
	for _, set := range ckptSets(files) {
		path := filepath.Join(dir, set[0].name)
		meta, err := readMeta(path)
		if errors.Is(err, fs.ErrNotExist) {
			// Removed since the listing: an older set than a complete
			// one (removeOlder, from another server).
			continue
		}
		var l classic.Layout
		if err == nil {
			l, err = checkMeta(set[0], meta)
		}
		if err != nil {
			return checkpointSet{}, fmt.Errorf("server: checkpoint %s (move it away to pass it over): %w", path, err)
		}
		if id := missing(set, l); id != 0 {
			c.passed = append(c.passed, fmt.Sprintf("%s lacks %s's file", set[0].ckptLabel, id))
			continue
		}
		c.ckptLabel, c.files, c.layout = set[0].ckptLabel, set, l
		break
	}
	return c, nil
}

// readSet is dir's newest complete set of checkpoints of a run before
// stamp. A directory with checkpoints of such runs but no complete set is
// an error: starting empty would silently lose what they hold.
func readSet(dir string, stamp uint64) (checkpointSet, error) {
	set, err := newestSet(dir, stamp)
	if err == nil && len(set.files) == 0 && len(set.passed) > 0 {
		err = fmt.Errorf("server: no complete set of checkpoints in %s (%s): move them away to start empty", dir, strings.Join(set.passed, "; "))
	}
	return set, err
}

func readMeta(path string) ([]byte, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	return kvstore.ReadMeta(f)
}

// load reads the keys of [from, to) (to == 0: no upper bound) from the
// set's files that hold any, each checked whole (a torn or corrupted file
// is an error naming it).
func (c checkpointSet) load(ctx context.Context, dir string, from, to uint64) (*kvstore.Store, error) {
	store := kvstore.New()
	for _, f := range c.files {
		if err := ctx.Err(); err != nil {
			return nil, fmt.Errorf("server: loading the checkpoint from %s: %w", dir, err)
		}
		lo, hi, ok := c.layout.Span(f.server, from, to)
		if !ok {
			continue
		}
		path := filepath.Join(dir, f.name)
		b, err := os.ReadFile(path)
		if err != nil {
			return nil, fmt.Errorf("server: checkpoint %s: %w", path, err)
		}
		// A value kept shares the file's memory: a file kept in part is
		// copied out of, so that the rest of it can go.
		first, end, _ := c.layout.Range(f.server)
		meta, err := store.LoadRange(b, lo, hi, lo != first || hi != end)
		if err == nil {
			_, err = checkMeta(f, meta)
		}
		if err != nil {
			return nil, fmt.Errorf("server: checkpoint %s (move the set away to start empty): %w", path, err)
		}
	}
	return store, nil
}

// ReadCheckpoint is every key of the newest complete set of checkpoints
// in dir (FPT_CHECKPOINT_DIR): what a restarted job would hold.
func ReadCheckpoint(dir string) (*kvstore.Store, error) {
	set, err := readSet(dir, math.MaxUint64)
	if err != nil {
		return nil, err
	}
	return set.load(context.Background(), dir, 0, 0)
}

// loadCheckpoint is the keys that server self owns in layout own (a
// starting job's first) from dir's newest complete set of an earlier run;
// no set is an empty store (the job's first start). The files of this run
// (stamp) that other servers may have written already are passed over; a
// file of a later run is refused: the scheduler's clock went back, and
// this run's checkpoints would never be read.
func loadCheckpoint(ctx context.Context, dir string, self node.ID, own classic.Layout, stamp uint64) (*kvstore.Store, checkpointSet, error) {
	set, err := readSet(dir, stamp)
	if err == nil && set.later.stamp > stamp {
		err = fmt.Errorf("server: checkpoint %s is of a run after this job (%016x): is the scheduler's clock behind the one of the run that wrote it?", filepath.Join(dir, set.later.name), stamp)
	}
	if err != nil || len(set.files) == 0 {
		return kvstore.New(), set, err
	}
	from, to, ok := own.Range(self)
	if !ok {
		return kvstore.New(), set, nil
	}
	store, err := set.load(ctx, dir, from, to)
	return store, set, err
}

// checkDir refuses, before the server joins, a checkpoint directory that
// is not one: failing later would stop the whole cluster.
func checkDir(dir string) error {
	fi, err := os.Stat(dir)
	if err == nil && !fi.IsDir() {
		err = errors.New("not a directory")
	}
	if err != nil {
		return fmt.Errorf("server: FPT_CHECKPOINT_DIR %s: %w", dir, err)
	}
	return nil
}

// removeOlder removes dir's checkpoint files older than its newest
// complete set, once there is one: they are never read again. Another
// server may be removing the same files.
func removeOlder(dir string) error {
	set, err := newestSet(dir, math.MaxUint64)
	if err != nil || len(set.files) == 0 {
		return err
	}
	entries, err := os.ReadDir(dir)
	if err != nil {
		return fmt.Errorf("server: checkpoints: %w", err)
	}
	for _, e := range entries {
		// A temporary file a crash left (writeAtomic's name.tmp*) goes
		// with its label.
		name, _, _ := strings.Cut(e.Name(), ".tmp")
		if f, ok := parseCkptName(name); ok && f.compare(set.ckptLabel) < 0 {
			if err := os.Remove(filepath.Join(dir, e.Name())); err != nil && !errors.Is(err, fs.ErrNotExist) {
				return fmt.Errorf("server: checkpoints: %w", err)
			}
		}
	}
	return nil
}

// writeAtomic replaces path with data so that a crash at any moment
// leaves either the old file or the new one, whole: the data goes to a
// temporary file in the same directory, is synced, renamed over path, and
// the directory is synced so that the rename itself survives.
func writeAtomic(path string, data []byte) (err error) {
	dir := filepath.Dir(path)
	f, err := os.CreateTemp(dir, filepath.Base(path)+".tmp*")
	if err != nil {
		return fmt.Errorf("server: checkpoint: %w", err)
	}
	defer func() {
		if err != nil {
			_ = os.Remove(f.Name())
			err = fmt.Errorf("server: checkpoint %s: %w", path, err)
		}
	}()
	_, err = f.Write(data)
	if err == nil {
		err = f.Sync()
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return err
	}
	if err = os.Rename(f.Name(), path); err != nil {
		return err
	}
	d, err := os.Open(dir)
	if err != nil {
		return err
	}
	err = d.Sync()
	if cerr := d.Close(); err == nil {
		err = cerr
	}
	return err
}

// checkpointer writes the store once at its start and then every
// interval if it changed, and once more when stopped.
type checkpointer struct {
	dir string
	// snapshot encodes the store if it is to be written (changed, or
	// force), and names its file; name "" is nothing to write.
	snapshot func(force bool) (name string, data []byte, err error)
	log      *slog.Logger
	failed   bool // the last write failed: the next one writes even if nothing changed
	quit     chan struct{}
	done     chan struct{}
	haltOnce sync.Once
}

func startCheckpointer(dir string, every time.Duration, snapshot func(force bool) (string, []byte, error), log *slog.Logger) *checkpointer {
	c := &checkpointer{dir: dir, snapshot: snapshot, log: log, quit: make(chan struct{}), done: make(chan struct{})}
	go c.loop(every)
	return c
}

func (c *checkpointer) loop(every time.Duration) {
	defer close(c.done)
	t := time.NewTicker(every)
	defer t.Stop()
	// At once: this run's first set completes, and the last run's goes,
	// as soon as every server has loaded its keys.
	tick := make(chan time.Time, 1)
	tick <- time.Now()
	for {
		select {
		case <-tick:
			tick = nil
		case <-t.C:
		case <-c.quit:
			return
		}
		// A failed periodic checkpoint does not stop training: the next
		// tick (or the last one) tries again.
		if err := c.write(); err != nil {
			c.log.Warn("checkpoint failed", "err", err)
		}
	}
}

// write saves the store if it changed since the last write, then removes
// the files a complete newer set made useless.
func (c *checkpointer) write() error {
	name, data, err := c.snapshot(c.failed)
	if err != nil || name == "" {
		return err
	}
	path := filepath.Join(c.dir, name)
	if err := writeAtomic(path, data); err != nil {
		c.failed = true
		return err
	}
	c.failed = false
	c.log.Debug("checkpoint written", "file", path, "bytes", len(data))
	// The file is written: a failure to tidy up is not the checkpoint's.
	if err := removeOlder(c.dir); err != nil {
		c.log.Warn("older checkpoints not removed", "err", err)
	}
	return nil
}

// halt ends the periodic writes; it may be called again.
func (c *checkpointer) halt() {
	c.haltOnce.Do(func() {
		close(c.quit)
		<-c.done
	})
}

// stop ends the periodic writes and, if last, writes a final checkpoint.
func (c *checkpointer) stop(last bool) error {
	c.halt()
	if !last {
		return nil
	}
	return c.write()
}
