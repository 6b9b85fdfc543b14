// gocheck verifies what the gateway serves with Go's golang.org/x/mod/sumdb/note and sumdb/tlog
// (Debian's golang-golang-x-mod-dev): an implementation independent of the gateway's. It prints
// nothing and exits 0 when the check holds; it prints the failure and exits 1 when it does not.
//
//	gocheck note VKEY NOTE                   the note's signature by VKEY (note.Open)
//	gocheck cosignature VKEY NOTE            a cosignature/v1 line by the witness VKEY (c2sp.org/tlog-cosignature)
//	gocheck inclusion LEAF INDEX NOTE PROOF  leaf INDEX holds LEAF in the note's tree (tlog.CheckRecord)
//	gocheck consistency OLD NEW PROOF        the tree of note OLD is a prefix of note NEW's (tlog.CheckTree)
//	gocheck receipt VKEY RECEIPT LEAF...     a User's receipt of the Run ledger: its checkpoint signed by VKEY,
//	                                         and each LEAF at the index of the receipt's entry in the same place
//	                                         (its runs, then its instructions) with that entry's proof
//
// NOTE, OLD, NEW, LEAF and RECEIPT (JSON, as GET /messages/{seq}/receipt answers) are files; PROOF is
// a file of base64 hashes, one a line.
package main

import (
	"bytes"
	"crypto/ed25519"
	"crypto/sha256"
	"encoding/base64"
	"encoding/binary"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"strconv"
	"strings"

	"golang.org/x/mod/sumdb/note"
	"golang.org/x/mod/sumdb/tlog"
)

func main() {
	if err := run(os.Args[1:]); err != nil {
		fmt.Println(err)
		os.Exit(1)
	}
}

func run(args []string) error {
	if len(args) == 0 {
		return errors.New("usage: gocheck note|cosignature|inclusion|consistency|receipt ...")
	}
	switch {
	case args[0] == "note" && len(args) == 3:
		_, err := openNote(args[1], read(args[2]))
		return err
	case args[0] == "cosignature" && len(args) == 3:
		return checkCosignature(args[1], read(args[2]))
	case args[0] == "inclusion" && len(args) == 5:
		index, err := strconv.ParseInt(args[2], 10, 64)
		if err != nil {
			return err
		}
		size, root, err := tree(read(args[3]))
		if err != nil {
			return err
		}
		proof, err := hashes(read(args[4]))
		if err != nil {
			return err
		}
		return tlog.CheckRecord(tlog.RecordProof(proof), size, root, index, tlog.RecordHash(read(args[1])))
	case args[0] == "receipt" && len(args) >= 3:
		return checkReceipt(args[1], read(args[2]), args[3:])
	case args[0] == "consistency" && len(args) == 4:
		oldSize, oldRoot, err := tree(read(args[1]))
		if err != nil {
			return err
		}
		newSize, newRoot, err := tree(read(args[2]))
		if err != nil {
			return err
		}
		proof, err := hashes(read(args[3]))
		if err != nil {
			return err
		}
		return tlog.CheckTree(tlog.TreeProof(proof), newSize, newRoot, oldSize, oldRoot)
	}
	return fmt.Errorf("unknown command or wrong arguments: %q", args)
}

func read(path string) []byte {
	data, err := os.ReadFile(path)
	if err != nil {
		fmt.Println(err)
		os.Exit(1)
	}
	return data
}

func openNote(vkey string, msg []byte) (*note.Note, error) {
	verifier, err := note.NewVerifier(vkey)
	if err != nil {
		return nil, err
	}
	return note.Open(msg, note.VerifierList(verifier))
}

// tree reads a checkpoint's size and root hash (c2sp.org/tlog-checkpoint: origin, size, root).
func tree(text []byte) (int64, tlog.Hash, error) {
	lines := strings.Split(string(text), "\n")
	if len(lines) < 3 {
		return 0, tlog.Hash{}, errors.New("not a checkpoint")
	}
	size, err := strconv.ParseInt(lines[1], 10, 64)
	if err != nil {
		return 0, tlog.Hash{}, err
	}
	root, err := tlog.ParseHash(lines[2])
	return size, root, err
}

func hashes(text []byte) ([]tlog.Hash, error) {
	var parsed []tlog.Hash
	for _, line := range strings.Fields(string(text)) {
		hash, err := tlog.ParseHash(line)
		if err != nil {
			return nil, err
		}
		parsed = append(parsed, hash)
	}
	return parsed, nil
}

// checkCosignature: x/mod's note has no cosignature/v1 verifier (algorithm 0x04), so the signed
// message is built here, per c2sp.org/tlog-cosignature, and checked with crypto/ed25519.
func checkCosignature(vkey string, msg []byte) error {
	parts := strings.SplitN(vkey, "+", 3) // base64 has "+" too
	if len(parts) != 3 {
		return errors.New("a vkey is name+hash+key")
	}
	name := parts[0]
	key, err := base64.StdEncoding.DecodeString(parts[2])
	if err != nil || len(key) != 1+ed25519.PublicKeySize || key[0] != 0x04 {
		return errors.New("not a cosignature/v1 vkey")
	}
	id := sha256.Sum256(append([]byte(name+"\n"), key...))
	if hex.EncodeToString(id[:4]) != parts[1] {
		return errors.New("the vkey's key ID does not match its name and key")
	}
	split := bytes.LastIndex(msg, []byte("\n\n"))
	if split < 0 {
		return errors.New("not a signed note")
	}
	text := msg[:split+1]
	prefix := "\u2014 " + name + " "
	for _, line := range strings.Split(string(msg[split+2:]), "\n") {
		if !strings.HasPrefix(line, prefix) {
			continue
		}
		sig, err := base64.StdEncoding.DecodeString(line[len(prefix):])
		if err != nil || len(sig) != 4+8+ed25519.SignatureSize || !bytes.Equal(sig[:4], id[:4]) {
			continue
		}
		timestamp := binary.BigEndian.Uint64(sig[4:12])
		signed := append([]byte(fmt.Sprintf("cosignature/v1\ntime %d\n", timestamp)), text...)
		if ed25519.Verify(key[1:], signed, sig[12:]) {
			return nil
		}
	}
	return fmt.Errorf("no cosignature by %s verifies", name)
}

// receiptEntry is one proved entry of a receipt; its leaf is not read here: the caller gives the
// leaves it expects, made on its own.
type receiptEntry struct {
	Seq    int64    `json:"seq"`
	Index  int64    `json:"index"`
	Hashes []string `json:"hashes"`
}

// checkReceipt: the receipt's checkpoint opens under vkey (note.Open), and leaves[i] is the leaf at
// the index of the receipt's i-th entry (runs, then instructions), by that entry's proof (tlog.CheckRecord).
func checkReceipt(vkey string, data []byte, leaves []string) error {
	var receipt struct {
		Checkpoint   string         `json:"checkpoint"`
		Runs         []receiptEntry `json:"runs"`
		Instructions []receiptEntry `json:"instructions"`
	}
	if err := json.Unmarshal(data, &receipt); err != nil {
		return err
	}
	opened, err := openNote(vkey, []byte(receipt.Checkpoint))
	if err != nil {
		return err
	}
	size, root, err := tree([]byte(opened.Text))
	if err != nil {
		return err
	}
	entries := append(receipt.Runs, receipt.Instructions...)
	if len(entries) != len(leaves) {
		return fmt.Errorf("the receipt holds %d entries, %d leaves given", len(entries), len(leaves))
	}
	for i, entry := range entries {
		if entry.Index != entry.Seq-1 {
			return fmt.Errorf("entry %d: index %d is not seq - 1", entry.Seq, entry.Index)
		}
		var proof []tlog.Hash
		for _, text := range entry.Hashes {
			hash, err := tlog.ParseHash(text)
			if err != nil {
				return err
			}
			proof = append(proof, hash)
		}
		if err := tlog.CheckRecord(proof, size, root, entry.Index, tlog.RecordHash(read(leaves[i]))); err != nil {
			return fmt.Errorf("entry %d: %v", entry.Seq, err)
		}
	}
	return nil
}
