"""The patch series: patch files and trailers, where code is (by lines, by tokens, across the
package), each patch's verdict on a tree (`classify`), text edits."""
