"""The asyncio server: listeners, connections, group commit, background work.

asyncio lives here and nowhere below: protocol codecs, the core and the journal are all
synchronous and know nothing of the loop. Nothing outside ``cli`` and ``testing`` imports this
package.
"""
