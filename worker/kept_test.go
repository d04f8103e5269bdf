package worker

import (
	"bufio"
	"fmt"
	"os"
	"slices"
	"strings"
	"testing"
	"unsafe"
)

// vmFlags is the VmFlags line of the mapping of this process that starts
// at addr, from /proc/self/smaps.
func vmFlags(t *testing.T, addr uintptr) []string {
	t.Helper()
	f, err := os.Open("/proc/self/smaps")
	if err != nil {
		t.Skipf("no smaps to read the mapping's flags from: %v", err)
	}
	defer f.Close()
	start := fmt.Sprintf("%x-", addr)
	in := false
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		line := sc.Text()
		if fields := strings.Fields(line); len(fields) > 0 && strings.Contains(fields[0], "-") && !strings.HasSuffix(fields[0], ":") {
			in = strings.HasPrefix(line, start)
			continue
		}
		if in && strings.HasPrefix(line, "VmFlags:") {
			return strings.Fields(strings.TrimPrefix(line, "VmFlags:"))
		}
	}
	if err := sc.Err(); err != nil {
		t.Fatal(err)
	}
	t.Fatalf("no mapping at %#x in /proc/self/smaps", addr)
	return nil
}

// TestMapKeptAsksForHugePages checks that the memory Init's values are
// copied into is advised for huge pages: with 4 KiB pages the copy is
// mostly page faults. Its values are kept exactly.
func TestMapKeptAsksForHugePages(t *testing.T) {
	const n = 8 << 20
	mem, err := mapKept(n)
	if err != nil {
		t.Fatal(err)
	}
	defer func() {
		if err := unmapKept(mem); err != nil {
			t.Error(err)
		}
	}()
	if len(mem) != n {
		t.Fatalf("len = %d, want %d", len(mem), n)
	}
	if flags := vmFlags(t, uintptr(unsafe.Pointer(&mem[0]))); !slices.Contains(flags, "hg") {
		t.Errorf("VmFlags = %q, want hg (MADV_HUGEPAGE)", flags)
	}
	src := make([]byte, n)
	for i := range src {
		src[i] = byte(i * 7)
	}
	copyPreemptible(mem, src)
	if !slices.Equal(mem, src) {
		t.Error("kept values differ from the copied ones")
	}
}
