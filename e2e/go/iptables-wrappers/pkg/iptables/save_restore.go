package iptables

import (
	"bytes"

	"k8s.io/utils/set"
)

// MakeChainLine returns the iptables-save/iptables-restore line that declares
// chain: ":NAME - [0:0]" (no policy, zero packet and byte counters). Given to
// iptables-restore for an existing chain, it also flushes that chain.
func MakeChainLine(chain Chain) string {
	return ":" + string(chain) + " - [0:0]"
}

// GetChainsFromTable returns the names of the chains declared in save, the
// iptables-save output of a single table: one for each line of the form
// ":NAME POLICY [PACKETS:BYTES]", built-in chains included.
func GetChainsFromTable(save []byte) set.Set[Chain] {
	chains := set.New[Chain]()
	for len(save) > 0 {
		var line []byte
		if i := bytes.IndexByte(save, '\n'); i >= 0 {
			line, save = save[:i], save[i+1:]
		} else {
			line, save = save, nil
		}
		if len(line) == 0 || line[0] != ':' {
			continue
		}
		name := line[1:]
		end := bytes.IndexByte(name, ' ')
		if end <= 0 {
			// Not a well-formed chain line.
			continue
		}
		chains.Insert(Chain(name[:end]))
	}
	return chains
}

// LineData is one line of iptables-restore input with its line number.
type LineData struct {
	// Line is the line number; the first line is 1.
	Line int
	// Data is the text of the line without its newline.
	Data string
}

// ExtractLines returns line number line of lines (counting from 1) with up to
// count lines either side of it, for showing the context of an
// iptables-restore parse error. It returns nil when line is below 1, and
// fewer lines when the window runs past either end of the input.
func ExtractLines(lines []byte, line, count int) []LineData {
	if line < 1 {
		return nil
	}
	if count < 0 {
		count = 0
	}
	first, last := line-count, line+count
	if first < 1 {
		first = 1
	}
	var out []LineData
	for n := 1; len(lines) > 0 && n <= last; n++ {
		var text []byte
		if i := bytes.IndexByte(lines, '\n'); i >= 0 {
			text, lines = lines[:i], lines[i+1:]
		} else {
			text, lines = lines, nil
		}
		if n >= first {
			out = append(out, LineData{Line: n, Data: string(text)})
		}
	}
	return out
}
